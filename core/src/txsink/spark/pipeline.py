"""Run a validated :class:`~txsink.config.PipelineConfig` on Spark (``txsink run``).

Builds the session, the source, the SQL transform and the ``txsink`` write, then
reports progress per batch (Spark's input rows, and txsink's committed rows and
commit latency read from the coordinator's state) until a bounded mode says stop.

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
import itertools
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.backend import Backend
from txsink.config import PipelineConfig, duration_ms
from txsink.errors import ConfigError, SinkOwnedError, TxsinkError
from txsink.model import DeliveryGuarantee
from txsink.plugins import Plugins, get_plugins
from txsink.spark._proc import OWNER_ENV
from txsink.spark.console import CLIENT_LOGGERS, default_log_path, spark_output_to
from txsink.spark.group import TargetSet
from txsink.state import EpochRecord, EpochState, StateStore, new_owner_token
from txsink.targets import TargetSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: How long ``txsink run`` waits for a target server that is down before Spark starts.
DEFAULT_CONNECT_RETRY_S = 10.0

Printer = Callable[[str], None]


@dataclass
class RunResult:
    """What one ``run`` did, for the summary line and for tests.

    Counts and bounds only, never one entry per epoch: a streaming run may last months.
    """

    #: Micro-batches of this run that Spark reported as complete.
    batches: int = 0
    #: Epochs committed during this run, and the first and last of them.
    epochs: int = 0
    first_epoch: int | None = None
    last_epoch: int | None = None
    rows: int = 0
    #: A group's rows per target (``rows`` is their sum).
    rows_by_target: dict[str, int] = field(default_factory=dict)
    stopped_because: str = ""
    #: The signal that interrupted the run (SIGINT, SIGTERM), if one did.
    signal: int | None = None
    #: False when stopping the query failed after an interrupt (a Spark Connect server
    #: that no longer answers may still run it).
    query_stopped: bool = True

    def add(self, record: EpochRecord) -> None:
        """Count one newly committed epoch."""
        self.epochs += 1
        self.rows += record.rows
        if self.first_epoch is None:
            self.first_epoch = record.epoch
        self.last_epoch = record.epoch
        for c in record.committables:
            if c.target:
                self.rows_by_target[c.target] = self.rows_by_target.get(c.target, 0) + c.rows

    @property
    def exit_status(self) -> int:
        """0, or the shell's 128 + signal number for an interrupted run (130, 143)."""
        return 128 + self.signal if self.signal else 0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``txsink run`` stops the query and prints its summary."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` in the main thread.

    Without this, SIGTERM kills the driver without a summary, and Ctrl-C leaves it
    to whichever py4j call is running to fail noisily.
    """
    old = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _take_back_sigint() -> None:
    """PySpark's SparkContext installs its own SIGINT handler (cancel jobs over py4j,
    which fails when it interrupts another py4j call); use ours again."""
    signal.signal(signal.SIGINT, _raise_interrupted)


def prepare_environment(master: str) -> None:
    """Point Spark's Python workers at this interpreter; keep local mode on loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


#: The data source option carrying the lease owner of a ``txsink run --remote`` run.
LEASE_OWNER_OPTION = "lease_owner"


def check_remote(url: str) -> str:
    """A Spark Connect address (``sc://host:port[/;params]``), or a ConfigError."""
    if not url.startswith("sc://") or len(url) <= len("sc://"):
        raise ConfigError(f"--remote / SPARK_REMOTE: {url!r} is not a Spark Connect address; "
                          "give sc://HOST:PORT (e.g. sc://127.0.0.1:15002)", field="--remote")
    return url


def build_remote_session(cfg: PipelineConfig, remote: str,
                         out: Printer) -> SparkSession:
    """A Spark Connect session with the pipeline's settings, txsink registered in it.

    ``spark.master`` is the server's business; of ``spark.conf`` the server takes what
    a session may set (Spark SQL settings) and refuses the rest, which is said.
    """
    try:
        from pyspark.sql.connect.session import SparkSession as RemoteSession
    except ImportError as exc:
        raise ConfigError(f"--remote needs the Spark Connect client: pip install "
                          f"'txsink[connect]' ({exc})", field="--remote") from None
    from txsink.spark import register

    # No option on the builder: create() would send it to the server under PySpark's
    # default retry policy (over ten minutes against a server that is not there).
    spark: SparkSession = RemoteSession.builder.remote(remote).create()  # type: ignore[assignment]
    _bound_retries(spark)
    with contextlib.suppress(Exception):  # a static setting some servers refuse
        spark.conf.set("spark.app.name", cfg.spark.app_name)
    conf = dict(cfg.spark.conf)
    if cfg.source.type == "files" and not cfg.source.schema:
        conf["spark.sql.streaming.schemaInference"] = "true"
    refused = []
    for key, value in conf.items():
        try:
            spark.conf.set(key, value)
        except Exception:  # the server refuses static and cluster settings
            refused.append(key)
    if refused:
        out(f"spark.conf not applied: {', '.join(sorted(refused))} (settings of the Spark "
            "Connect server itself: set them where the server is started)")
    register(spark)
    return spark


def reach_remote(remote: str, bound_s: float) -> None:
    """Wait up to ``bound_s`` for the Spark Connect server at ``remote`` to accept a
    connection, or stop with one line naming ``--remote`` / ``SPARK_REMOTE``.

    Runs before the run takes the checkpoint's lease: a mistyped address must never
    fence a healthy query, and must fail within txsink's bound, not after PySpark's
    own Connect retries (over ten minutes).
    """
    try:
        import grpc  # type: ignore[import-untyped,unused-ignore]
        from pyspark.sql.connect.client import DefaultChannelBuilder
    except ImportError as exc:  # (DefaultChannelBuilder: PySpark 4.0 and later)
        raise ConfigError(f"--remote needs the Spark Connect client: pip install "
                          f"'txsink[connect]' ({exc})", field="--remote") from None
    try:
        channel = DefaultChannelBuilder(remote).toChannel()
    except Exception as exc:  # a malformed address or parameter
        raise ConfigError(f"--remote / SPARK_REMOTE: {remote!r} is not a usable Spark Connect "
                          f"address: {_first_lines(str(exc))}", field="--remote") from None
    try:
        grpc.channel_ready_future(channel).result(timeout=max(bound_s, 0.1))
    except grpc.FutureTimeoutError:
        raise ConfigError(
            f"--remote / SPARK_REMOTE: no Spark Connect server answered at {remote} within "
            f"{bound_s:g}s: check the address (host, port) and that the server runs. "
            "Nothing was started and the checkpoint was not touched; `txsink run "
            "--connect-retry SECONDS` waits longer", field="--remote") from None
    finally:
        channel.close()


def connect_remote(cfg: PipelineConfig, remote: str, bound_s: float,
                   out: Printer) -> SparkSession:
    """The run's Connect session, made before the lease is taken (see
    :func:`reach_remote`); a server that refuses the session is one line too."""
    reach_remote(remote, bound_s)
    try:
        return build_remote_session(cfg, remote, out)
    except Exception as exc:
        if not _is_connect_error(exc):
            raise
        raise ConfigError(f"--remote / SPARK_REMOTE: the Spark Connect server at {remote} "
                          f"did not open a session: {_first_lines(str(exc))}",
                          field="--remote") from None


#: Retries of a call to the Spark Connect server that does not answer: about a minute
#: (PySpark's own policy waits over ten; a restarted server has lost the session anyway).
CONNECT_RETRIES = 6


def _bound_retries(spark: SparkSession) -> None:
    """A server that stopped answering stops the run within about a minute."""
    try:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        spark.client.set_retry_policies(
            [DefaultPolicy(max_retries=CONNECT_RETRIES)])
    except (ImportError, AttributeError):  # another client: keep its own policy
        log.debug("could not bound the Spark Connect client's retries", exc_info=True)


def build_session(cfg: PipelineConfig) -> SparkSession:
    from pyspark.sql import SparkSession

    from txsink.spark import register

    prepare_environment(cfg.spark.master)
    builder = SparkSession.builder.master(cfg.spark.master).appName(cfg.spark.app_name)
    # Spark logs failures with JVM stack traces; `txsink run` reports them itself.
    builder = builder.config("spark.log.level", "ERROR")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in cfg.spark.conf.items():
        builder = builder.config(key, value)
    for key, value in realtime_defaults(cfg).items():
        builder = builder.config(key, value)
    if cfg.source.type == "files" and not cfg.source.schema:
        builder = builder.config("spark.sql.streaming.schemaInference", "true")
    spark = builder.getOrCreate()
    register(spark)
    return spark


#: A real-time pipeline's rows reach its Python ``foreach`` writer through a buffered
#: stream of this many bytes (Spark's default is 64 KiB): a smaller one hands them on
#: sooner, which is what real-time mode is for (docs/realtime.md, "The latency it gives").
REALTIME_BUFFER_BYTES = "512"
#: Spark refuses real-time batches shorter than this setting (5 s by default).
MIN_BATCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"


def realtime_defaults(cfg: PipelineConfig) -> dict[str, str]:
    """Spark settings a real-time pipeline gets unless its ``spark.conf`` sets them: the
    small Python buffer, and a minimum batch length no longer than the trigger's (so
    ``real_time: 1 second`` runs instead of being refused)."""
    if cfg.trigger.kind != "real_time":
        return {}
    out = {"spark.buffer.size": REALTIME_BUFFER_BYTES}
    interval_ms = duration_ms(cfg.trigger.interval or "5 seconds")
    if interval_ms < 5000:
        out[MIN_BATCH_CONF] = str(interval_ms)
    return {k: v for k, v in out.items() if k not in cfg.spark.conf}


def build_frame(spark: SparkSession, cfg: PipelineConfig, *, shaped: bool = True
                ) -> DataFrame:
    """Source plus transform; Spark's complaints about either name the field at fault.
    ``shaped=False``: a group's frame as the transform made it (checked all the same),
    for the native path, which applies each target's select/where itself."""
    from txsink.spark.checks import build_checked_frame

    return build_checked_frame(spark, cfg, shaped=shaped)


def check_pipeline(cfg: PipelineConfig, log_path: Path) -> list[str]:
    """What ``txsink validate`` asks Spark: build the source, analyse the transform.

    Runs a local session (whatever ``spark.master`` says: no cluster is needed to
    analyse) and no query. Returns the output columns.
    """
    from pyspark.sql import SparkSession

    prepare_environment("local[1]")
    with spark_output_to(log_path):
        builder = (SparkSession.builder.master("local[1]").appName(f"txsink-validate-{cfg.name}")
                   .config("spark.ui.enabled", "false").config("spark.log.level", "ERROR"))
        for key, value in cfg.spark.conf.items():
            if key.startswith("spark.sql."):
                builder = builder.config(key, value)
        if cfg.source.type == "files" and not cfg.source.schema:
            builder = builder.config("spark.sql.streaming.schemaInference", "true")
        spark = builder.getOrCreate()
        try:
            from txsink.spark.checks import frame_columns

            return frame_columns(build_frame(spark, cfg), cfg)
        finally:
            spark.stop()


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
        return _run_realtime(cfg, timeout_s=timeout_s, out=out, poll_s=poll_s,
                             log_path=log_path, remote=remote)
    plugins = get_plugins()
    target = preflight(cfg, plugins, connect_retry_s)
    store = plugins.state_store(f"{cfg.checkpoint.rstrip('/')}/txsink")
    log_path = log_path or default_log_path(cfg.checkpoint, cfg.name)
    remote_spark = None
    if remote is not None:
        # The server first: taking the lease fences whatever query holds it.
        with spark_output_to(log_path):
            remote_spark = connect_remote(cfg, remote, connect_retry_s, out)
    try:
        check_ownership(cfg, plugins, store, pipeline_file or cfg.path or "PIPELINE_FILE")
    except BaseException:
        if remote_spark is not None:
            _quietly(remote_spark.stop, interrupted=True)
        raise
    for line in cfg.header_lines():
        out(line)
    out(f"delivery: {cfg.sink.guarantee.reader_note()}")
    for line in resume_notes(cfg, store):
        out(line)
    if remote is None:
        out(f"spark log: {log_path}")
        logs = f"Spark's log: {log_path}"
    else:
        out(f"spark: Spark Connect server {remote} (the query runs there: Spark's own log is "
            f"the server's; this client's log: {log_path})")
        if cfg.spark.master != "local[*]":
            out(f"spark.master {cfg.spark.master} is not used: the Connect server runs the "
                "query on its own master")
        logs = f"Spark's log is the Connect server's at {remote}; this client's: {log_path}"
    result = RunResult()
    committed_before = {e for e, state in store.states().items()
                        if state is EpochState.COMMITTED}
    with interrupts_as_exceptions(), spark_output_to(log_path):
        spark = None
        owner = None
        extra: dict[str, str] = {}
        #: The Connect server stopped answering: whether it still runs the query is
        #: unknown here.
        lost = False
        try:
            if remote is None:
                # Silent, this took long enough on a small machine to look hung.
                out(f"starting Spark ({cfg.spark.master}); the query starts once it is up")
                started = time.monotonic()
                spark = build_session(cfg)
                out(f"Spark started in {time.monotonic() - started:.0f}s")
                _take_back_sigint()
                owner = _jvm_owner(spark)
            else:
                spark = remote_spark
                assert spark is not None
                # No driver JVM here to name: the lease owner is this run, handed to the
                # data source in the server.
                owner = os.environ.get(OWNER_ENV) or remote_owner_token()
                extra[LEASE_OWNER_OPTION] = owner
            frame = pipeline_frame(spark, cfg, extra)
            if cfg.mode == "batch":
                result = _run_batch(frame, cfg, store, out, extra)
            else:
                result = _run_stream(frame, cfg, store, out, max_batches=max_batches,
                                     until_idle=until_idle, timeout_s=timeout_s, poll_s=poll_s,
                                     extra_options=extra)
        except KeyboardInterrupt as exc:  # while Spark started, or a batch write ran
            result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            result.stopped_because = f"interrupted by {signal.Signals(result.signal).name}"
            if remote is not None and spark is not None:
                # The server goes on with a batch write this client stopped waiting for.
                lost = not _quietly(spark.interruptAll, interrupted=True)
            _committed_into(result, store, committed_before)
        except TxsinkError as exc:
            raise _with_hints(exc, cfg, logs) from None
        except Exception as exc:
            if remote is None or not _is_connect_error(exc):
                raise
            lost = True  # whether a query of this run goes on there is not known here
            if not _server_gone(exc):
                # The server answered, with an error of the query (e.g. its checkpoint is
                # in use by another query there): say that, not that the server is gone.
                text = _first_lines(str(exc))
                in_use = any(w in str(exc) for w in _IN_USE_WORDS)
                raise _with_hints(TxsinkError(
                    f"the Spark Connect server at {remote} refused the query: "
                    + (f"checkpoint {cfg.checkpoint} is in use by another query there ("
                       f"{text})" if in_use else text)), cfg, logs) from None
            # The server went away (killed, restarted) or lost the session: one line, not
            # the client's stack of gRPC retries.
            raise _with_hints(TxsinkError(
                f"the Spark Connect server at {remote} failed or stopped answering: "
                f"{_first_lines(str(exc))}"), cfg, logs) from None
        finally:
            if spark is not None and result.signal is not None and remote is None:
                _stop_within(spark.stop, spark, "stopping Spark", out)
            elif spark is not None:
                _quietly(spark.stop, interrupted=result.signal is not None or remote is not None)
            # A Connect server that stopped answering may still run the query: the lease
            # stays held (`txsink status` shows it as unknown), the next run takes it over.
            # (In classic Spark the driver JVM ends with spark.stop(): its query too.)
            if owner is not None and (remote is None or (not lost and result.query_stopped)):
                _release(store, owner)
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


#: Spark's words for a streaming query whose checkpoint another active query uses.
_IN_USE_WORDS = ("already active", "CONCURRENT_QUERY", "ConcurrentModification")


def _server_gone(exc: BaseException) -> bool:
    """The Connect client lost its server (no answer within the retries, a deadline, a
    session the server no longer knows), as opposed to an error the server answered
    with: every server-side error reaches the client as a PySpark error too."""
    if type(exc).__module__.startswith("grpc") or type(exc).__name__ == "RetriesExceeded":
        return True
    status = getattr(exc, "getGrpcStatusCode", None)
    code = getattr(status() if callable(status) else None, "name", "")
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
        return True
    error_class = getattr(exc, "getCondition", getattr(exc, "getErrorClass", None))
    return str((error_class() if callable(error_class) else None) or "").startswith(
        "INVALID_HANDLE")


def _is_connect_error(exc: BaseException) -> bool:
    """An error of the Spark Connect client (PySpark's errors, gRPC's)."""
    module = type(exc).__module__
    return module.startswith(("pyspark.errors", "grpc"))


#: After SIGINT/SIGTERM, how long `txsink run` lets Spark stop the query and itself
#: (Spark waits for a batch in flight, e.g. an abort in a Python worker) before it kills
#: the driver's JVM and everything under it. Exactly once does not need the wait: the
#: next run recovers the epoch in flight as after a crash.
STOP_BOUND_S = 6.0


def _stop_within(action: Callable[[], object], spark: SparkSession | None, what: str,
                 out: Callable[[str], None] | None = None,
                 bound_s: float = STOP_BOUND_S) -> bool:
    """Run a stop step after a signal, for at most ``bound_s``; past that, kill the
    driver's JVM with its Python workers (the step then ends too). Whether it ran to
    its end."""
    done = threading.Event()
    ok = [False]

    def run() -> None:
        try:
            action()
            ok[0] = True
        except BaseException:
            log.debug("%s after an interrupt failed", what, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=run, name=f"txsink-{what}", daemon=True).start()
    try:
        finished = done.wait(bound_s)
    except KeyboardInterrupt:  # a second signal: no more waiting
        finished = done.is_set()
    if not finished:
        if out is not None:
            out(f"{what} took over {bound_s:.0f}s (a batch still running): stopping Spark's "
                "JVM; the next `txsink run` rolls back or finishes the epoch in flight")
        _kill_driver_jvm(spark)
        done.wait(2.0)
    return ok[0]


def _is_remote(frame: DataFrame) -> bool:
    """A Spark Connect frame: its JVM is the server's, never this run's to kill."""
    return type(frame).__module__.startswith("pyspark.sql.connect")


def _kill_driver_jvm(spark: SparkSession | None) -> None:
    from txsink.procfs import descendants

    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc",
                   None) if spark is not None else None
    if proc is None:
        return
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _quietly(action: Callable[[], object], *, interrupted: bool) -> bool:
    """Run a cleanup step; after an interrupt, Spark may already be gone: say nothing.
    Whether the step succeeded."""
    try:
        action()
    except (Exception, KeyboardInterrupt):
        if not interrupted:
            raise
        log.debug("cleanup after interrupt failed", exc_info=True)
        return False
    return True


def _jvm_owner(spark: SparkSession) -> str | None:
    """The lease owner token the sink's code in this session's JVM uses."""
    from txsink.spark._proc import jvm_owner_token

    if os.environ.get(OWNER_ENV):
        return os.environ[OWNER_ENV]
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return jvm_owner_token(proc.pid) if proc is not None else None


def remote_owner_token() -> str:
    """The lease owner of one ``txsink run --remote`` run: ``host:connect:PID:START``,
    this client process (its pid and start time, which pid reuse cannot repeat).

    While the client lives its run holds the checkpoint: a second run on this host is
    refused, naming it. Whether the server still runs the query of a client that died
    nothing here can tell; the run releases the lease when it ends.
    """
    import socket

    from txsink import procfs

    info = procfs.stat(os.getpid())
    started = info[2] if info is not None else 0
    return f"{socket.gethostname()}:connect:{os.getpid()}:{started}"


def _release(store: StateStore, owner: str) -> None:
    """Give the lease up at the end of a run, if this run's driver still holds it."""
    info = store.lease_info()
    if info.get("owner") == owner and info.get("released_at") is None:
        from txsink.state import Lease

        with contextlib.suppress(TxsinkError, OSError):
            store.release(Lease(owner, int(info["generation"])))


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




def preflight(cfg: PipelineConfig, plugins: Plugins, connect_retry_s: float) -> str:
    """The backend's checks before Spark starts; returns its description.

    A server that is down is retried for ``connect_retry_s`` (``--connect-retry``), not
    for the running query's own, longer, bound; the retries are not printed one by
    one: the run stops with one line that says what was tried and for how long.
    """
    _refuse_changed_targets(cfg, plugins)
    retry_options: dict[str, dict[str, str]] = {}
    retry_keys = set()
    for name, backend_name in ([(t.name, t.backend) for t in cfg.sink.targets]
                               or [(cfg.sink.sink_id, cfg.sink.backend)]):
        option = plugins.backends.get(backend_name).value.connect_retry_option
        if option is not None:
            retry_options[name] = {option: f"{connect_retry_s:g}"}
            retry_keys.add(option)
    backend = cfg.create_backend(plugins, retry_options)
    quiet = _QuietRetries()
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        backend.preflight(cfg.sink.sink_id)
        return backend.describe()
    except ConfigError as exc:
        if cfg.sink.targets:
            where = f"sink.{exc.field}" if exc.field else "sink.targets"
        else:
            where = f"sink.options.{exc.field}" if exc.field else "sink"
        tried = (f". Before Spark starts a run waits {connect_retry_s:g}s for a server that "
                 "is down (`txsink run --connect-retry SECONDS`; the backend's option bounds "
                 "the wait of a running query)"
                 if quiet.retries or any(k in str(exc) for k in retry_keys) else "")
        raise type(exc)(f"{where}: {exc}{tried}", field=where,
                        sink_id=cfg.sink.sink_id) from None
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)
        backend.close()


def _refuse_changed_targets(cfg: PipelineConfig, plugins: Plugins) -> None:
    """Targets other than the ones the state recorded are refused before the backends'
    preflight claims a new target's output: the refusal's way out (a new sink_id)
    must still work after it. A single sink moved under its kept state (another path,
    table, topic) is refused here too, for the same reason."""
    from txsink.targets import changed_targets, moved_target

    root = cfg.checkpoint.rstrip("/") + "/txsink"
    local = root.removeprefix("file://")
    if "://" not in local and not Path(local, "meta.json").is_file():
        return
    meta = plugins.state_store(root).read_meta()
    if meta is None or meta.sink_id != cfg.sink.sink_id:
        return
    if not cfg.sink.targets:
        if meta.backend != cfg.sink.backend or not meta.options or not cfg.sink.options:
            return  # another backend: the coordinator refuses it
        cls = plugins.backend_class(cfg.sink.backend)
        moved = moved_target({"backend": meta.backend, "options": meta.options},
                             cfg.sink.sink_id, cls.destination(cfg.sink.options),
                             cfg.sink.sink_id, backend=cls, field="sink.options")
        if moved is not None:
            raise moved
        return
    refusal = changed_targets(meta.targets, cfg.sink.targets, cfg.sink.sink_id)
    if refusal is not None:
        refusal.field = "sink.targets"
        raise refusal


class _QuietRetries(logging.Filter):
    """Counts, and keeps off the terminal, the retry lines of a server that is down
    (and its client library's own reconnect noise) while the run checks it."""

    def __init__(self) -> None:
        super().__init__()
        self.retries = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "txsink_retry", False):
            self.retries += 1
            return False
        return record.name.split(".", 1)[0] not in CLIENT_LOGGERS


def check_ownership(cfg: PipelineConfig, plugins: Plugins, store: StateStore,
                    pipeline_file: str) -> None:
    """Bind the sink to this checkpoint's state before Spark starts, or say why not.

    The same check runs again inside Spark; here a refusal is one line with the
    way out that applies instead of a traceback from a Python worker.
    """
    from txsink.coordinator import Coordinator
    from txsink.spark._proc import owner_alive

    holder = store.lease_info()
    if holder.get("owner") and holder.get("released_at") is None and owner_alive(
            str(holder["owner"])):
        owner = str(holder["owner"])
        remote_pid = owner.split(":connect:", 1)[1].split(":")[0] if ":connect:" in owner \
            else None
        who = (f"the `txsink run --remote` client pid {remote_pid} on this host, whose "
               "query runs on its Spark Connect server" if remote_pid else "a running query")
        raise ConfigError(
            f"checkpoint {cfg.checkpoint} is in use by another run: sink "
            f"{cfg.sink.sink_id!r} is being written by {who} (lease owner {owner}); stop "
            "it (Ctrl-C) before starting another run on this checkpoint",
            field="checkpoint", sink_id=cfg.sink.sink_id)
    meta_before = store.read_meta()
    backend = cfg.create_backend(plugins)
    try:
        coordinator = Coordinator(backend, store, cfg.sink.sink_id,
                                  backend_options=cfg.sink.options, plugins=plugins,
                                  owner=new_owner_token(), scan_orphans=False)
        try:
            coordinator.start(recover=False)
        except SinkOwnedError as exc:
            if meta_before is None:
                _forget_new_state(store)
            from txsink.group import TargetGroup

            # A group: the target that refused, and a reset only if every target has one.
            backends = (list(m.backend for m in backend.members.values())
                        if isinstance(backend, TargetGroup) else [backend])
            resettable = all(type(b).reset_sink is not Backend.reset_sink for b in backends)
            target = backend.describe()
            if isinstance(backend, TargetGroup):
                target = next((f"target {m.name!r}: {m.backend.describe()}"
                               for m in backend.members.values() if m.sink_id == exc.sink_id),
                              target)
            raise _owned_hint(exc, cfg, target,
                              pipeline_file if resettable else None,
                              fresh=meta_before is None, here=store.location) from None
        except BaseException:
            # Any other refusal (a directory bound to another sink id, a server down):
            # the state this check made would keep the refused destination as the
            # sink's, and the way out the message gives would be refused as a move.
            if meta_before is None:
                _forget_new_state(store)
            raise
        store.release(coordinator.lease)
    finally:
        backend.close()


def _forget_new_state(store: StateStore) -> None:
    """Remove the empty state this check created, so the next try sees the same thing."""
    root = Path(store.location)
    if store.records() or not any((root / name).is_file()
                                  for name in ("meta.json", "lease.json")):
        return  # not a state this check made
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):  # the checkpoint dir, if nothing else is in it
        root.parent.rmdir()


def _owned_hint(exc: SinkOwnedError, cfg: PipelineConfig, target: str,
                pipeline_file: str | None, *, fresh: bool, here: str) -> ConfigError:
    owner = exc.owner_state or "?"
    sink = cfg.sink.sink_id
    # The owner's state is gone, or it was at this very location and this run found
    # no state there: the checkpoint was deleted (and the check just made a new one).
    gone = (fresh and os.path.abspath(owner) == os.path.abspath(here)) or (
        "://" not in owner and not Path(owner, "meta.json").exists())
    if gone and pipeline_file is not None:
        message = (f"sink {sink!r} ({target}) was written by an earlier run whose txsink "
                   f"state {owner} no longer exists (its checkpoint was deleted). To start "
                   f"over, deleting that output: txsink reset {pipeline_file}. To keep it: "
                   "give this pipeline a new sink_id and output location")
    elif gone:
        message = (f"sink {sink!r} ({target}) was written by an earlier run whose txsink "
                   f"state {owner} no longer exists (its checkpoint was deleted). "
                   f"`txsink reset` cannot delete what it wrote "
                   f"({'a target of the group' if cfg.sink.targets else cfg.sink.backend} "
                   f"keeps its output): give this pipeline a new sink_id to start over "
                   f"({exc})")
    else:
        message = (f"sink {sink!r} ({target}) belongs to another query, whose txsink state "
                   f"is {owner}; a sink id belongs to one query: give this pipeline its own "
                   "sink_id and output location (or stop using the other query's checkpoint)")
    return ConfigError(message, field="sink.sink_id", sink_id=sink)


def resume_notes(cfg: PipelineConfig, store: StateStore) -> list[str]:
    """Say that a run continues an earlier one, where, and what it replays first."""
    checkpoint = Path(cfg.checkpoint.removeprefix("file://"))
    if cfg.mode != "streaming" or (
            "://" in cfg.checkpoint and not cfg.checkpoint.startswith("file://")):
        return []  # a batch write is one new epoch; remote checkpoints are not read here

    def batch_ids(sub: str) -> list[int]:
        folder = checkpoint / sub
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

    offsets, commits = batch_ids("offsets"), batch_ids("commits")
    records = store.records()
    if not offsets and not records:
        return []
    meta = store.read_meta()
    in_doubt = sorted(e for e, r in records.items() if r.state is EpochState.DECIDED)
    # Micro-batch b is epoch stream_from + b (above a backfill's epochs, if one came first).
    base = meta.stream_from if meta is not None and meta.stream_from is not None else 0
    last_offset = offsets[-1] + base if offsets else -1
    last_commit = commits[-1] + base if commits else -1
    replay = last_offset if last_offset > last_commit else None
    next_epoch = (last_offset + 1 if offsets else base) if replay is None else replay
    line = f"resuming sink {cfg.sink.sink_id!r} at epoch {next_epoch} from {cfg.checkpoint}"
    if replay is not None:
        line += (f"; replaying epoch {replay} (planned before the last stop but not finished "
                 "in Spark)")
    notes = [line]
    if in_doubt:
        notes.append(f"epoch(s) {', '.join(map(str, in_doubt))} were decided but not fully "
                     "committed: txsink commits them first")
    if (meta is not None and meta.committed_watermark >= 0) or any(
            r.state is EpochState.COMMITTED for r in records.values()):
        notes.append("the first batch also reads what the source produced while the "
                     "pipeline was stopped (catch-up rows): expect it to be larger")
    return notes


def _committed_into(result: RunResult, store: StateStore, seen: set[int]) -> None:
    for record in _committed_since(store, seen):
        result.add(record)


def preview_files(path: str, rows: int = 3) -> list[str]:
    """A few committed rows of a files sink, so a demo run shows what it wrote."""
    base = Path(path)
    finals = sorted((p for p in base.glob("part-*") if p.is_file()), reverse=True)
    for f in finals:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            sample = pq.read_table(f).slice(0, rows).to_pylist()
        else:
            with f.open(encoding="utf-8") as fh:
                sample = [json.loads(line) for line in itertools.islice(fh, rows)]
        if sample:
            lines = [f"sample of {f}:"]
            lines += [f"  {json.dumps(r, default=str)}" for r in sample]
            return lines
    return []


def _committed_since(store: StateStore, seen: set[int]) -> list[EpochRecord]:
    """Epochs committed since ``seen``: polled while the query runs, so only the new
    records are read. ``seen`` keeps only epochs the state still holds (the coordinator
    prunes old ones), so it stays as small as the state however long the run."""
    fresh = []
    states = store.states()
    for epoch, state in sorted(states.items()):
        if state is EpochState.COMMITTED and epoch not in seen:
            record = store.get(epoch)
            if record is not None:
                fresh.append(record)
    seen.update(r.epoch for r in fresh)
    seen.intersection_update(states)
    return fresh


def _epoch_line(record: EpochRecord, progress: Mapping[str, Any] | None) -> str:
    latency = ""
    if record.committed_at is not None:
        latency = f", commit {1000 * (record.committed_at - record.decided_at):.0f} ms"
    spark_part = ""
    if progress:
        took = progress.get("durationMs", {}).get("triggerExecution")
        spark_part = f" (input {progress.get('numInputRows', '?')} rows" + (
            f", batch {took / 1000:.1f} s)" if took is not None else ")")
    targets: dict[str, int] = {}
    for c in record.committables:
        if c.target:
            targets[c.target] = targets.get(c.target, 0) + c.rows
    rows = (", ".join(f"{n} {r}" for n, r in targets.items()) + " row(s)" if targets
            else f"{record.rows} row(s)")
    return (f"batch {record.epoch}: {rows} in {len(record.committables)} "
            f"participant(s){latency}{spark_part}")


def pipeline_frame(spark: SparkSession, cfg: PipelineConfig,
                   extra_options: Mapping[str, str] | None) -> DataFrame:
    """The frame ``txsink run`` writes: shaped for txsink's data source, or, for a group
    on the native path (:class:`TargetSet`, which applies each target's select/where in
    its own job), as the transform made it. Seen: shaped, the native path applied a
    target's ``select`` to the shaped columns and the first batch failed
    (UNRESOLVED_COLUMN)."""
    native = bool(cfg.sink.targets) and _native_targets(
        cfg, extra_options, stream=cfg.mode != "batch") is not None
    return build_frame(spark, cfg, shaped=not native)


def _native_targets(cfg: PipelineConfig, extra_options: Mapping[str, str] | None, *,
                    stream: bool) -> TargetSet | None:
    """The sink as a :class:`TargetSet` when Spark's own Parquet writer writes it (a
    table format, or files in Parquet; the native data path, ``TargetSet.write`` /
    ``write_stream``): a group with such a target, or such a single sink with the
    exactly-once guarantee. Not under Spark Connect (``extra_options`` carry the lease
    owner there), and not for a stream whose state a stream already wrote through
    txsink's data source: those pipelines keep the data source path."""
    if extra_options:
        return None
    if cfg.sink.targets:
        group = TargetSet(cfg.sink.sink_id, cfg.sink.targets,
                          checkpoint_location=cfg.checkpoint)
    else:
        if cfg.sink.guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
            return None
        spec = TargetSpec(cfg.sink.sink_id, cfg.sink.backend, dict(cfg.sink.options))
        group = TargetSet(cfg.sink.sink_id, [spec], checkpoint_location=cfg.checkpoint,
                          single=True)
    if not group.native():
        return None
    if stream and not group.native_stream():
        return None
    return group


def _run_realtime(cfg: PipelineConfig, *, timeout_s: float | None, out: Printer,
                 poll_s: float = 0.5, log_path: Path | None = None,
                 remote: str | None = None) -> RunResult:
    """``txsink run`` of a pipeline file with ``trigger: {real_time: ...}``.

    Runs until the query ends, ``timeout_s`` passes, or SIGINT/SIGTERM; stopping in the
    middle of a real-time batch is safe (the next run replays it and skips what the
    target holds).
    """
    from txsink.realtime import DEFAULT_COMMIT_INTERVAL_S
    from txsink.realtime.config import COMMIT_INTERVAL
    from txsink.spark.realtime import (
        local_slots,
        parse_seconds,
        release_hold,
        start_realtime,
        unread_error,
        unread_partitions,
    )

    if remote is not None:
        raise ConfigError("real-time mode runs its query in a local driver; remove --remote "
                          "(Spark Connect is not supported for it yet)", field="remote")
    options = dict(cfg.sink.options)
    interval = options.pop(COMMIT_INTERVAL, None)
    log_path = log_path or default_log_path(cfg.checkpoint, cfg.name)
    into = (f"{len(cfg.sink.targets)} targets ({', '.join(t.name for t in cfg.sink.targets)}"
            "), each by its own stored positions" if cfg.sink.targets else cfg.sink.backend)
    out(f"pipeline {cfg.name}: real-time mode (batches of {cfg.trigger.interval}), exactly "
        f"once by source position into {into} as sink {cfg.sink.sink_id}")
    out(f"spark log: {log_path}")
    result = RunResult()
    batches: set[int] = set()
    with interrupts_as_exceptions(), spark_output_to(log_path):
        spark = build_session(cfg)
        _take_back_sigint()
        query = None
        try:
            frame = build_frame(spark, cfg)
            where: dict[str, Any] = (
                {"targets": cfg.sink.targets, "field_prefix": "sink.targets"}
                if cfg.sink.targets else {"backend": cfg.sink.backend, "options": options,
                                          "field_prefix": "sink.targets"})
            query = start_realtime(
                frame, sink_id=cfg.sink.sink_id, checkpoint_location=cfg.checkpoint,
                trigger=cfg.trigger.interval or "5 seconds",
                commit_interval=(parse_seconds(interval, "sink.options.commit_interval")
                                 if interval else DEFAULT_COMMIT_INTERVAL_S),
                query_name=cfg.name.replace("-", "_"), **where)
            started = time.monotonic()
            while query.isActive:
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    result.stopped_because = f"--timeout {timeout_s:g}s reached"
                    break
                query.awaitTermination(max(1, round(poll_s)))
                for progress in query.recentProgress:
                    # Spark's numInputRows reads 0 for real-time batches (PySpark 4.3):
                    # only the batch ids are worth showing.
                    batch = int(progress.get("batchId", -1))
                    if batch >= 0 and batch not in batches:
                        batches.add(batch)
                        out(f"real-time batch {batch} completed (Spark's checkpoint moved "
                            "past it)")
                unread = unread_partitions(query.recentProgress,
                                           local_slots(cfg.spark.master))
                if unread:
                    raise unread_error(unread, cfg.sink.sink_id)
            else:
                result.stopped_because = "query finished"
        except KeyboardInterrupt as exc:
            result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            result.stopped_because = f"interrupted by {signal.Signals(result.signal).name}"
        finally:
            error = None
            if query is not None and result.signal is not None:
                # Rows committed so far stay; the next run skips them by position.
                _stop_within(query.stop, spark, "stopping the real-time query", out)
            elif query is not None:
                try:
                    query.stop()
                    error = query.exception()
                except Exception as exc:
                    log.warning("stopping the real-time query: %s", exc)
            if query is not None:
                release_hold(query)  # its heartbeat says it ended (txsink status, reset)
            if result.signal is not None:
                _stop_within(spark.stop, spark, "stopping Spark", out)
            else:
                spark.stop()
    if error is not None:
        raise TxsinkError(f"the real-time query failed: {str(error).strip().splitlines()[0]}",
                          sink_id=cfg.sink.sink_id)
    result.batches = len(batches)
    out(f"done ({result.stopped_because}): {result.batches} real-time batch(es) completed; "
        "rows committed since the last completed batch are in the target too, and the "
        "next run skips them")
    return result


def _run_batch(frame: DataFrame, cfg: PipelineConfig, store: StateStore,
               out: Printer, extra_options: dict[str, str] | None = None) -> RunResult:
    seen = {e for e, state in store.states().items() if state is EpochState.COMMITTED}
    native = _native_targets(cfg, extra_options, stream=False)
    if native is not None:
        native.write(frame)
    else:
        options = {**cfg.sink_write_options(), **(extra_options or {})}
        frame.write.format("txsink").mode("append").options(**options).save()
    result = RunResult(stopped_because="batch write finished")
    for record in _committed_since(store, seen):
        out(_epoch_line(record, None))
        result.add(record)
    return result


def _run_stream(frame: DataFrame, cfg: PipelineConfig, store: StateStore, out: Printer, *,
                max_batches: int | None, until_idle: bool, timeout_s: float | None,
                poll_s: float, extra_options: dict[str, str] | None = None) -> RunResult:
    native = _native_targets(cfg, extra_options, stream=True)
    if native is not None:
        writer = native.write_stream(frame)
    else:
        options = {**cfg.sink_write_options(), **(extra_options or {})}
        writer = frame.writeStream.format("txsink").options(**options)
    trig = cfg.trigger
    if trig.kind == "processing_time" and trig.interval:
        writer = writer.trigger(processingTime=trig.interval)
    elif trig.kind == "once":
        writer = writer.trigger(once=True)
    elif trig.kind == "available_now":
        writer = writer.trigger(availableNow=True)
    seen = {e for e, state in store.states().items() if state is EpochState.COMMITTED}
    query = writer.queryName(cfg.name.replace("-", "_")).start()
    result = RunResult()
    progress = _Progress()
    pending: list[EpochRecord] = []

    stream_from: list[int] = []  # read once the stream fixed it (its first planning)

    def report(final: bool = False) -> None:
        result.batches += progress.update(query.recentProgress)
        pending.extend(_committed_since(store, seen))
        if pending and not stream_from:
            meta = store.read_meta()
            if meta is not None and meta.stream_from is not None:
                stream_from.append(meta.stream_from)
        # Spark's progress is by batch id; micro-batch b is epoch stream_from + b.
        base = stream_from[0] if stream_from else 0
        for record in list(pending):
            # Wait for Spark's progress of the batch so the line shows both sides.
            if progress.has(record.epoch - base) or final:
                out(_epoch_line(record, progress.pop(record.epoch - base)))
                result.add(record)
                pending.remove(record)
        progress.forget_up_to(min((r.epoch - base for r in pending), default=None))

    started = time.monotonic()
    idle_polls = 0
    try:
        while True:
            report()
            if not query.isActive:
                result.stopped_because = "query finished"
                break
            if max_batches is not None and result.batches >= max_batches:
                result.stopped_because = f"--max-batches {max_batches} reached"
                break
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                result.stopped_because = f"--timeout {timeout_s:g}s reached"
                break
            if until_idle and result.batches:
                status = query.status
                idle = not status.get("isDataAvailable") and not status.get("isTriggerActive")
                idle_polls = idle_polls + 1 if idle else 0
                if idle_polls >= 3:
                    result.stopped_because = "idle: no new input"
                    break
            time.sleep(poll_s)
        _stop_between_batches(query, poll_s)
    except KeyboardInterrupt as exc:
        result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        result.stopped_because = f"interrupted by {signal.Signals(result.signal).name}"
    finally:
        interrupted = result.signal is not None
        stop = lambda: query.stop() if query.isActive else None  # noqa: E731
        result.query_stopped = (
            _stop_within(stop, frame.sparkSession, "stopping the query", out)
            if interrupted and not _is_remote(frame) else _quietly(stop, interrupted=interrupted))
    if result.signal is not None:
        # SIGTERM to the process group stops Spark's JVM too: count from the state alone.
        for record in pending:
            out(_epoch_line(record, progress.pop(record.epoch)))
            result.add(record)
        for record in _committed_since(store, seen):
            out(_epoch_line(record, None))
            result.add(record)
        return result
    error = query.exception()
    if error is not None:
        raise TxsinkError(f"the streaming query failed: {_first_lines(str(error))}")
    report(final=True)
    return result


class _Progress:
    """Spark's progress of the batches not yet printed, and which batch ids were counted.

    Spark's ``recentProgress`` repeats its last 100 entries at every poll; a batch is
    counted once, by its id (ids only grow within a run). Entries are dropped once
    their epoch's line is printed, or once no pending epoch can use them, so a run of
    months keeps a few entries, not one per batch.
    """

    #: Entries kept at most, whatever happens to the epochs they belong to.
    KEEP = 200

    def __init__(self) -> None:
        self._by_batch: dict[int, Mapping[str, Any]] = {}
        self._highest = -1

    def update(self, entries: Sequence[Mapping[str, Any]]) -> int:
        """Take the entries of one poll; returns how many batches are new."""
        new = 0
        for p in entries:
            batch = int(p["batchId"])
            if batch > self._highest:
                self._highest = batch
                self._by_batch[batch] = p
                new += 1
            elif batch == self._highest and batch in self._by_batch:
                # A later report of the same batch (Spark reports an idle trigger
                # under the id of the batch that runs next): keep the latest.
                self._by_batch[batch] = p
        while len(self._by_batch) > self.KEEP:
            del self._by_batch[min(self._by_batch)]
        return new

    def has(self, batch: int) -> bool:
        return batch in self._by_batch or batch < self._highest - self.KEEP

    def pop(self, batch: int) -> Mapping[str, Any] | None:
        return self._by_batch.pop(batch, None)

    def forget_up_to(self, oldest_pending: int | None) -> None:
        """Drop entries older than every epoch still waiting for its line (the newest
        one stays: its epoch may not be committed yet)."""
        limit = self._highest - 1 if oldest_pending is None else oldest_pending - 1
        for batch in [b for b in self._by_batch if b <= limit]:
            del self._by_batch[batch]

    def __len__(self) -> int:
        return len(self._by_batch)


def _stop_between_batches(query: Any, poll_s: float, wait_s: float = 5.0) -> None:
    """Stop when no batch is running, so a bounded run leaves no half-written epoch.

    A batch stopped mid-way is safe too (aborted now, its late participants aborted
    at the next start), just noisier.
    """
    deadline = time.monotonic() + wait_s
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive"):
            query.stop()
            return
        time.sleep(min(poll_s, 0.05))


_TXSINK_ERROR = re.compile(r"txsink\.(?:[a-z_]+\.)*(?P<kind>[A-Z]\w+): (?P<message>.+)")
_PYTHON_ERROR = re.compile(r"^(?:[a-z_]\w*\.)*(?P<kind>[A-Z]\w*(?:Error|Exception|Fault)): "
                           r"(?P<message>.+)")


def _first_lines(text: str) -> str:
    """The txsink error inside a Spark/Python traceback, else the Python error at the
    bottom of it, else Spark's first line."""
    found = _TXSINK_ERROR.search(text)
    if found:
        return f"{found['kind']}: {found['message'].strip()}"
    from txsink.spark.checks import spark_message

    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    python = [m for m in map(_PYTHON_ERROR.match, lines) if m]
    if python:
        return f"{python[-1]['kind']}: {python[-1]['message'].strip()}"
    lines = [ln for ln in lines
             if not ln.startswith(("at ", "File ", "Traceback", "==", "+-"))]
    return spark_message(Exception(lines[0] if lines else text))
