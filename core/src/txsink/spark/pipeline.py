"""Run a validated :class:`~txsink.config.PipelineConfig` on Spark (``txsink run``).

:func:`run_pipeline` is the run from start to end: preflight and the sink-ownership
check before Spark starts, the session, the run loop for the pipeline's mode, and
the summary. Each job has its own module in this package:

- ``session``: the classic Spark session (and ``txsink validate``'s);
- ``connect``: Spark Connect (``--remote``): reaching the server, its session, its errors;
- ``ownership``: preflight of the targets, the lease and the sink-ownership check;
- ``frames``: the frame a run writes, and whether Spark's own writer writes it;
- ``run_stream``, ``run_batch``, ``run_realtime``: the three run loops;
- ``report``: what a run prints (epoch lines, resume notes, the result it counts);
- ``signals``: SIGINT and SIGTERM, and stop steps bounded in time.

The session is a classic one (this process starts the driver JVM) or, with
``--remote``/``SPARK_REMOTE``, a Spark Connect client: the query then runs in the
Connect server, whose Python workers run txsink's writers and coordinator. What
this process reads of the JVM in classic mode has a Connect counterpart here: the
lease owner is a token of this run, handed to the data source as an option; Spark's
own log is the server's; an interrupt stops the query (and interrupts a batch write)
through the server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from txsink.config import PipelineConfig
from txsink.errors import ConfigError, TxsinkError
from txsink.plugins import get_plugins
from txsink.spark._proc import OWNER_ENV, command_owner_token
from txsink.spark.connect import (
    IN_USE_WORDS,
    LEASE_OWNER_OPTION,
    check_remote,
    connect_remote,
    is_connect_error,
    remote_owner_token,
    server_gone,
)
from txsink.spark.console import default_log_path, spark_output_to
from txsink.spark.frames import pipeline_frame
from txsink.spark.messages import first_lines
from txsink.spark.ownership import check_ownership, jvm_owner, preflight, release_lease
from txsink.spark.report import Printer, RunResult, committed_into, preview_files, resume_notes
from txsink.spark.run_batch import run_batch
from txsink.spark.run_realtime import run_realtime
from txsink.spark.run_stream import run_stream
from txsink.spark.session import (
    MIN_BATCH_CONF,
    build_session,
    check_pipeline,
    realtime_defaults,
)
from txsink.spark.signals import (
    Interrupted,
    interrupts_as_exceptions,
    quietly,
    stop_within,
    take_back_sigint,
)
from txsink.state import EpochState

#: What callers of ``txsink run``'s machinery import from here (the CLI, tests); each
#: name lives in the module of its job.
__all__ = ["DEFAULT_CONNECT_RETRY_S", "MIN_BATCH_CONF", "RunResult", "build_session",
           "check_ownership", "check_pipeline", "check_remote", "pipeline_frame", "preflight",
           "realtime_defaults", "remote_owner_token", "resume_notes", "run_pipeline"]

#: How long ``txsink run`` waits for a target server that is down before Spark starts.
DEFAULT_CONNECT_RETRY_S = 10.0


def run_pipeline(
    cfg: PipelineConfig,
    *,
    max_batches: int | None = None,
    until_idle: bool = False,
    timeout_s: float | None = None,
    out: Printer = print,
    poll_s: float = 0.5,
    log_path: Path | None = None,
    pipeline_file: str | None = None,
    connect_retry_s: float = DEFAULT_CONNECT_RETRY_S,
    remote: str | None = None,
) -> RunResult:
    """Run ``cfg`` until it ends, a bound is reached, or SIGINT/SIGTERM.

    Preflight and the sink-ownership check run before Spark starts. Spark's own
    output goes to ``log_path``; errors raised here name it. With ``remote`` (a Spark
    Connect address) the query runs in that server; this process still reads the
    txsink state at the checkpoint, which must be reachable from here too.
    """
    if cfg.trigger.kind == "real_time":  # no epochs or state: docs/realtime.md
        return run_realtime(cfg, timeout_s=timeout_s, out=out, poll_s=poll_s,
                            log_path=log_path, remote=remote, until_idle=until_idle)
    plugins = get_plugins()
    target = preflight(cfg, plugins, connect_retry_s)
    store = plugins.state_store(f"{cfg.checkpoint.rstrip('/')}/txsink")
    log_path = log_path or default_log_path(cfg.checkpoint, cfg.name)
    # The run's lease owner: this process (a Connect client's token under --remote). The
    # run holds the lease from its ownership check on, while Spark starts too, and its
    # query's coordinators take the same owner (the data source option under --remote,
    # TXSINK_OWNER, which the driver JVM and its Python workers inherit, otherwise).
    owner = os.environ.get(OWNER_ENV) or (
        remote_owner_token() if remote is not None else command_owner_token("run"))
    remote_spark = None
    if remote is not None:
        # The server first: taking the lease fences whatever query holds it.
        with spark_output_to(log_path):
            remote_spark = connect_remote(cfg, remote, connect_retry_s, out)
    with _owner_for_the_query(owner if remote is None else None):
        try:
            check_ownership(cfg, plugins, store, pipeline_file or cfg.path or "PIPELINE_FILE",
                            hold_as=owner)
        except BaseException:
            if remote_spark is not None:
                quietly(remote_spark.stop, interrupted=True)
            raise
        #: A Connect server that stopped answering may still run the query: then the
        #: lease stays held (`txsink status` shows it as unknown), the next run takes it
        #: over. (In classic Spark the driver JVM ends with spark.stop(): its query too.)
        keep_lease = False
        jvm: str | None = None
        try:
            for line in cfg.header_lines():
                out(line)
            out(f"delivery: {cfg.sink.guarantee.reader_note()}")
            for line in resume_notes(cfg, store):
                out(line)
            if remote is None:
                out(f"spark log: {log_path}")
                logs = f"Spark's log: {log_path}"
            else:
                out(f"spark: Spark Connect server {remote} (the query runs there: Spark's own "
                    f"log is the server's; this client's log: {log_path})")
                if cfg.spark.master != "local[*]":
                    out(f"spark.master {cfg.spark.master} is not used: the Connect server runs "
                        "the query on its own master")
                logs = (f"Spark's log is the Connect server's at {remote}; this client's: "
                        f"{log_path}")
            result = RunResult()
            committed_before = {e for e, state in store.states().items()
                                if state is EpochState.COMMITTED}
            with interrupts_as_exceptions(), spark_output_to(log_path):
                spark = None
                extra: dict[str, str] = {}
                #: The Connect server stopped answering: whether it still runs the query
                #: is unknown here.
                lost = False
                try:
                    if remote is None:
                        # Silent, this took long enough on a small machine to look hung.
                        out(f"starting Spark ({cfg.spark.master}); the query starts once it "
                            "is up")
                        started = time.monotonic()
                        spark = build_session(cfg)
                        out(f"Spark started in {time.monotonic() - started:.0f}s")
                        take_back_sigint()
                        # A driver JVM this process launched before (another run, a test)
                        # kept the owner it was started with: its coordinators take the
                        # lease over under that one, given up at the end too.
                        jvm = jvm_owner(spark)
                    else:
                        spark = remote_spark
                        assert spark is not None
                        # No driver JVM here: the data source in the server is handed it.
                        extra[LEASE_OWNER_OPTION] = owner
                    frame = pipeline_frame(spark, cfg, extra)
                    if cfg.mode == "batch":
                        result = run_batch(frame, cfg, store, out, extra)
                    else:
                        result = run_stream(frame, cfg, store, out, max_batches=max_batches,
                                            until_idle=until_idle, timeout_s=timeout_s,
                                            poll_s=poll_s, extra_options=extra)
                except KeyboardInterrupt as exc:  # while Spark started, or a batch write ran
                    result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
                    result.stopped_because = (
                        f"interrupted by {signal.Signals(result.signal).name}")
                    if remote is not None and spark is not None:
                        # The server goes on with a batch write this client stopped
                        # waiting for.
                        lost = not quietly(spark.interruptAll, interrupted=True)
                    committed_into(result, store, committed_before)
                except TxsinkError as exc:
                    raise _with_hints(exc, cfg, logs) from None
                except Exception as exc:
                    if remote is None or not is_connect_error(exc):
                        raise
                    lost = True  # whether a query of this run goes on there is not known
                    raise _connect_failure(exc, cfg, remote, logs) from None
                finally:
                    if spark is not None and result.signal is not None and remote is None:
                        stop_within(spark.stop, spark, "stopping Spark", out)
                    elif spark is not None:
                        quietly(spark.stop,
                                interrupted=result.signal is not None or remote is not None)
                    keep_lease = remote is not None and (lost or not result.query_stopped)
        finally:
            if not keep_lease:
                release_lease(store, owner)
                if jvm is not None and jvm != owner:
                    release_lease(store, jvm)
    span = (f"epochs {result.first_epoch}-{result.last_epoch}" if result.epochs > 1 else
            f"epoch {result.first_epoch}" if result.epochs else "no epoch")
    if result.rows_by_target:
        per = ", ".join(f"{n} {r}" for n, r in result.rows_by_target.items())
        out(f"done ({result.stopped_because}): committed {span} exactly once to every "
            f"target, row(s) per target: {per} ({target})")
    else:
        out(f"done ({result.stopped_because}): committed {span}, {result.rows} row(s) "
            f"exactly once to {target}")
    if result.signal is not None:
        out(f"a batch that was still running is rolled back and replayed by the next "
            f"`txsink run`. "
            f"`txsink status {cfg.checkpoint}` shows the sink's state")
    if cfg.sink.backend == "files" and not cfg.sink.targets and result.rows:
        for line in preview_files(cfg.sink.options.get("path", "")):
            out(line)
    return result


@contextlib.contextmanager
def _owner_for_the_query(owner: str | None) -> Iterator[None]:
    """``TXSINK_OWNER`` set to the run's lease owner while it runs (a classic session's
    driver JVM, its Python workers and the native path's coordinator here take it), so
    the lease the run took before Spark started is its query's own: no gap between the
    two in which another command could take the checkpoint."""
    if owner is None or os.environ.get(OWNER_ENV) == owner:
        yield
        return
    before = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = owner
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before


def _connect_failure(exc: Exception, cfg: PipelineConfig, remote: str,
                     logs: str) -> TxsinkError:
    """An error of the Spark Connect client in one line: the query's error the server
    answered with, or the server gone (killed, restarted, the session lost)."""
    if not server_gone(exc):
        # The server answered, with an error of the query (e.g. its checkpoint is in use
        # by another query there): say that, not that the server is gone.
        text = first_lines(str(exc))
        in_use = any(w in str(exc) for w in IN_USE_WORDS)
        return _with_hints(TxsinkError(
            f"the Spark Connect server at {remote} refused the query: "
            + (f"checkpoint {cfg.checkpoint} is in use by another query there ({text})"
               if in_use else text)), cfg, logs)
    # Not the client's stack of gRPC retries.
    return _with_hints(TxsinkError(
        f"the Spark Connect server at {remote} failed or stopped answering: "
        f"{first_lines(str(exc))}"), cfg, logs)


def _with_hints(exc: TxsinkError, cfg: PipelineConfig, logs: str) -> TxsinkError:
    """A failure after Spark started: name Spark's log and where to look next."""
    if isinstance(exc, ConfigError) and (exc.field or "").startswith(("transform", "source")):
        return exc  # reported before any batch ran: the line says it all
    message = (f"{exc} ({logs}); `txsink status {cfg.checkpoint}` shows what "
               "the failed batch left, and the next `txsink run` finishes or rolls it back")
    clone = type(exc).__new__(type(exc))
    clone.__dict__.update(exc.__dict__)
    clone.args = (message,)
    return clone
