"""The ``txsink`` command line: run and validate pipelines, inspect and resolve sinks.

A :class:`~txsink.errors.TxsinkError` is printed as one message (no stack trace)
and the exit status is non-zero; anything else is a bug and keeps its traceback.
Spark is imported only by ``run``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.backend import Backend
from txsink.coordinator import Coordinator
from txsink.coordinator.identity import layout
from txsink.errors import ConfigError, ServerUnavailableError, StateError, TxsinkError
from txsink.group import TargetGroup
from txsink.model import Committable, DeliveryGuarantee
from txsink.plugins import Plugins, get_plugins
from txsink.redact import redact
from txsink.state import EpochRecord, EpochState, SinkMeta, StateStore
from txsink.targets import GROUP_BACKEND, changed_targets

if TYPE_CHECKING:
    from txsink.config import PipelineConfig

log = logging.getLogger(__name__)

EXIT_ERROR = 1
EXIT_USAGE = 2
#: The shell's status for a process ended by SIGINT (128 + 2); SIGTERM gives 143.
EXIT_INTERRUPTED = 130


#: The shell's status for a process ended by SIGPIPE (128 + 13): whoever read the output
#: went away (``txsink status | head -2``).
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    watch = _StdoutWatch(sys.stdout)
    sys.stdout = watch
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse after --help or a usage error
            with contextlib.suppress(BrokenPipeError):
                sys.stdout.flush()
            if not watch.broken:
                raise
            _stdout_to_devnull(watch)
            return EXIT_BROKEN_PIPE
        sys.stdout.flush()  # a reader gone before the last lines: found here, not at exit
        return code
    except BrokenPipeError:
        if not watch.broken:
            raise  # a socket's, not the reader's of our output: a real error
        _stdout_to_devnull(watch)
        return EXIT_BROKEN_PIPE
    finally:
        if sys.stdout is watch:
            sys.stdout = watch.stream


class _StdoutWatch:
    """Standard output, remembering whether a write failed because its reader went away.

    Python ignores SIGPIPE, so writing into a closed pipe raises BrokenPipeError; the
    CLI then stops quietly, as a command killed by SIGPIPE would. A BrokenPipeError
    from anything else (a server's socket) is not taken for it.
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        try:
            return int(self.stream.write(text))
        except BrokenPipeError:
            self.broken = True
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self.broken = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _stdout_to_devnull(watch: _StdoutWatch) -> None:
    """What is left in the buffer can never be read: drop it, so the interpreter's last
    flush at exit does not print a traceback of its own."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, watch.stream.fileno())
        os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        print("txsink: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except TxsinkError as exc:
        field = getattr(exc, "field", None)
        prefix = ("server down" if isinstance(exc, ServerUnavailableError) else
                  "config error" if isinstance(exc, ConfigError) else "error")
        # One line, whatever a server's message holds (libpq's ends in "\n\tIs the
        # server running ...?").
        message = " ".join(str(exc).split())
        if field and not message.startswith(field):
            message = f"{field}: {message}"
        print(f"txsink: {prefix}: {message}", file=sys.stderr)
        return EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txsink",
        description="Exactly-once output from PySpark pipelines (two-phase commit).")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v: info, -vv: debug)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a pipeline file on Spark",
                         description="Validate FILE, then run it on Spark and print each "
                         "committed batch (rows, participants, commit latency). Exit status: 0 "
                         "done, 1 error, 130/143 interrupted by SIGINT/SIGTERM.")
    run.add_argument("file", help="pipeline file (.yaml, .yml, .toml or .json)")
    run.add_argument("--max-batches", type=_positive_int, metavar="N",
                     help="stop once N more micro-batches of this run completed (a resumed "
                     "run counts from where it resumes; batches already started finish)")
    run.add_argument("--spark-log", metavar="PATH",
                     help="where Spark's own output goes (default: <checkpoint>-spark.log)")
    run.add_argument("--until-idle", action="store_true",
                     help="stop once the source has no new data (real-time mode: "
                     "3 batches in a row without input)")
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="stop after SECONDS (real-time mode: counted from the start, "
                     "Spark's included; the run ends within a few seconds of it)")
    run.add_argument("--connect-retry", type=float, metavar="SECONDS", default=None,
                     help="how long to wait for a target server that is down before Spark "
                     "starts (default 10); the running query waits as long as the "
                     "backend's own option says")
    run.add_argument("--metrics-port", type=int, metavar="PORT",
                     help="serve Prometheus metrics at http://HOST:PORT/metrics while the "
                     "pipeline runs (needs txsink[metrics])")
    run.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                     help="address the metrics endpoint binds to (default: 127.0.0.1)")
    run.add_argument("--remote", metavar="sc://HOST:PORT",
                     help="run on a Spark Connect server instead of starting Spark here "
                     "(default: $SPARK_REMOTE; needs txsink[connect] here and txsink with "
                     "the backends on the server)")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a pipeline file without running it",
                              description="Load FILE, resolve ${ENV} references and check "
                              "every field and the backend's options; then have a local Spark "
                              "session build the source and analyse the transform SQL (no "
                              "query runs, nothing is written).")
    validate.add_argument("file")
    validate.add_argument("--no-spark", action="store_true",
                          help="skip the Spark checks (source options, transform SQL)")
    validate.set_defaults(func=cmd_validate)

    reset = sub.add_parser(
        "reset", help="start a pipeline over: delete its checkpoint, state and output",
        description="Delete what FILE's pipeline wrote (its sink's output and owner record), "
        "then its checkpoint with the txsink state inside. Asks first unless --yes. The "
        "next `txsink run` starts from the beginning of the source.")
    reset.add_argument("file")
    reset.add_argument("--yes", action="store_true", help="do not ask")
    reset.add_argument("--force", action="store_true",
                       help="delete even though the sink's lease is held by a query whose "
                       "liveness cannot be checked from here (another host); only once you "
                       "know that query is stopped")
    reset.add_argument("--source-topic", action="append", default=None, metavar="TOPIC",
                       help="real-time pipelines: delete only the stored positions of this "
                       "source topic (one that was deleted and recreated); repeatable")
    reset.set_defaults(func=cmd_reset)

    backends = sub.add_parser("backends", help="list installed backends")
    backends.add_argument("--json", action="store_true", help="machine-readable output")
    backends.set_defaults(func=cmd_backends)

    status = sub.add_parser(
        "status", help="show a sink's epochs and pending/in-doubt participants",
        description="Read the coordinator state of a pipeline file (its checkpoint), or "
        "under CHECKPOINT_DIR (a query's checkpointLocation, or its txsink/ subdirectory), "
        "and list epochs, in-doubt (DECIDED, not yet committed) epochs and prepared "
        "participants no decision holds.")
    status.add_argument("checkpoint", metavar="PIPELINE_FILE|CHECKPOINT_DIR",
                        help="the pipeline file (as for run, cut and reset) or the "
                             "query's checkpoint directory")
    status.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="backend option not kept in the state (e.g. a password)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    resolve = sub.add_parser(
        "resolve", help="commit or abort one epoch by hand (operators)",
        description="Finish one epoch of a stopped query. --commit commits a DECIDED epoch "
        "(what a restart would do). --abort rolls back prepared participants of an "
        "undecided epoch; aborting a DECIDED epoch drops data and needs --force. Stop the "
        "query first: this takes over the sink's lease.")
    resolve.add_argument("checkpoint", metavar="CHECKPOINT_DIR")
    resolve.add_argument("--epoch", type=_epoch_number, required=True)
    action = resolve.add_mutually_exclusive_group(required=True)
    action.add_argument("--commit", action="store_true")
    action.add_argument("--abort", action="store_true")
    resolve.add_argument("--force", action="store_true",
                         help="allow aborting a DECIDED epoch (its output is lost)")
    resolve.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                         help="backend option not kept in the state (e.g. a password)")
    resolve.set_defaults(func=cmd_resolve)

    cut = sub.add_parser(
        "cut", help="print the consistent cut: the highest epoch every target holds",
        description="Ask each target of FILE's sink (each target of a group) for the highest "
        "epoch its own markers show committed, and the state for epochs not finished yet; "
        "print them and the cut: every epoch up to it is in every target. Readers that take "
        "epochs up to the cut from each target see the same epochs everywhere.")
    cut.add_argument("file", help="pipeline file")
    cut.add_argument("--json", action="store_true", help="machine-readable output")
    cut.set_defaults(func=cmd_cut)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("txsink")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# -- run / validate ------------------------------------------------------------------------


def unset_env_options(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """``(field, variable)`` for each ``*_env`` option (``password_env``, ...) of the sink
    or its targets that names an environment variable unset here: ``txsink run`` from
    this shell would fail at the first connection, after Spark started."""
    owners = [(f"sink.targets[{t.name}].options", t.options) for t in cfg.sink.targets]
    owners.append(("sink.options", cfg.sink.options))
    return [(f"{where}.{key}", str(value)) for where, options in owners
            for key, value in sorted(options.items())
            if key.endswith("_env") and value and not os.environ.get(str(value))]


def cmd_validate(args: argparse.Namespace) -> int:
    from txsink.config import check_source_exists, load_pipeline

    cfg = load_pipeline(args.file)
    check_source_exists(cfg)
    unset = unset_env_options(cfg)
    if unset:
        where, variable = unset[0]
        state = "is empty" if variable in os.environ else "is not set"
        raise ConfigError(f"{where}: environment variable {variable!r} {state} in this "
                          f"shell; export it before `txsink run` (Spark's executors need it "
                          f"too)", field=where)
    cfg.check_settings()  # what `run` refuses in its preflight, no server needed
    if args.no_spark:
        print(f"ok (Spark checks skipped): {cfg.summary()}")
        return 0
    try:
        from txsink.spark.pipeline import check_pipeline
    except ImportError:
        print(f"ok (PySpark is not installed: source options and the transform SQL were not "
              f"checked; install the spark extra, or pip install 'pyspark>=4.0'): {cfg.summary()}")
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="txsink-validate-") as tmp:
        log_path = Path(tmp, "spark.log")
        try:
            columns = check_pipeline(cfg, log_path)
        except TxsinkError:
            raise
        except Exception as exc:  # Spark itself failed to start
            kept = Path(tempfile.gettempdir(), f"txsink-validate-{cfg.name}-spark.log")
            with contextlib.suppress(OSError):
                kept.write_bytes(log_path.read_bytes())
            raise TxsinkError(f"Spark could not check the pipeline ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); Spark's log: "
                              f"{kept}. --no-spark skips these checks") from None
    print(f"ok: {cfg.summary()}")
    print(f"output columns: {', '.join(columns)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from txsink.config import check_source_exists, load_pipeline

    cfg = load_pipeline(args.file)  # every config error surfaces here, before Spark
    check_source_exists(cfg)
    try:
        from txsink.spark.pipeline import check_remote, run_pipeline
    except ImportError as exc:
        raise ConfigError(f"`txsink run` needs PySpark: install txsink's spark extra, or "
                          f"pip install 'pyspark>=4.0' ({exc})") from None
    remote = args.remote or os.environ.get("SPARK_REMOTE") or None
    if remote is not None:
        check_remote(remote)
        if args.metrics_port is not None:
            raise ConfigError(
                "--metrics-port cannot be used with --remote: the coordinator runs in the "
                "Spark Connect server's Python workers, which write their metrics where the "
                "server's environment says. Start the server with PROMETHEUS_MULTIPROC_DIR=DIR "
                "and TXSINK_METRICS=1 and serve DIR on its host (docs/spark.md, \"Spark Connect "
                "and managed platforms\")", field="--metrics-port")
    server = None
    if args.metrics_port is not None:
        from txsink import metrics

        # Before Spark starts: its Python workers, where the coordinator runs,
        # inherit the metrics directory through the driver JVM's environment.
        server = metrics.serve(args.metrics_port, args.metrics_host)
        print(f"metrics: {server.url}", flush=True)
    try:
        from txsink.spark.pipeline import DEFAULT_CONNECT_RETRY_S

        result = run_pipeline(cfg, max_batches=args.max_batches, until_idle=args.until_idle,
                              timeout_s=args.timeout, pipeline_file=args.file, out=_print_now,
                              log_path=Path(args.spark_log) if args.spark_log else None,
                              connect_retry_s=(DEFAULT_CONNECT_RETRY_S
                                               if args.connect_retry is None
                                               else args.connect_retry),
                              remote=remote)
    finally:
        if server is not None:
            server.close()
    return result.exit_status


def _print_now(line: str) -> None:
    """A line of ``txsink run``, out at once also into a pipe (``| tee run.log``): a run's
    lines come seconds or minutes apart, never worth a buffer's wait."""
    print(line, flush=True)


def _refuse_reset_under_a_holder(lease: dict[str, Any], sink_id: str,
                                 args: argparse.Namespace) -> None:
    """Never delete a sink's output under a query that may still write it.

    Only a released lease or a holder proven gone (its process ended on this host)
    lets ``reset`` go on by itself; a holder on another host, or one whose liveness
    cannot be told, needs the operator's ``--force`` after checking it is stopped. A
    ``txsink run`` holds the lease from before Spark starts: one still starting is
    running too.
    """
    from txsink.spark._proc import lease_holder, owner_words

    holder = lease_holder(lease)
    if holder == "running":
        owner = str(lease["owner"])
        who = (f"{owner_words(owner)} (starting Spark, or running its query)"
               if ":run:" in owner else
               f"{owner_words(owner)}, which is deleting it already" if ":reset:" in owner
               else "a running query on this host")
        raise StateError(f"sink {sink_id!r} is being written by {who} (lease owner "
                         f"{owner}); stop it first; nothing deleted", sink_id=sink_id)
    if holder == "unknown" and not args.force:
        raise StateError(
            f"sink {sink_id!r} is held by {lease['owner']} (generation "
            f"{lease.get('generation')}, since {_when(lease.get('acquired_at'))}), and "
            "whether that query still runs cannot be told from this host (another host, "
            "a container, or a pid that may be reused); nothing deleted. Stop that query; "
            f"once you know it is stopped, `txsink reset {args.file} --force` deletes anyway",
            sink_id=sink_id)
    if holder == "unknown":
        log.warning("reset: sink=%s: --force: deleting although the lease holder %s may "
                    "still run", sink_id, lease["owner"])


@contextlib.contextmanager
def _holding_for_reset(store: StateStore | None, sink_id: str,
                       args: argparse.Namespace) -> Iterator[None]:
    """Check the holder again right before deleting (a run may have started while the
    question waited for an answer), then hold the lease while deleting: a ``txsink run``
    starting meanwhile finds a live holder and refuses, instead of resuming a checkpoint
    that is going away. Given back if the reset stops half-way."""
    if store is None:
        yield
        return
    from txsink.spark._proc import command_owner_token
    from txsink.state import Lease

    before = store.lease_info()
    _refuse_reset_under_a_holder(before, sink_id, args)
    owner = command_owner_token("reset")
    lease = store.acquire(owner)
    try:
        if lease.generation != int(before.get("generation") or 0) + 1:
            # Another owner took the lease between the look and the take: judged as a
            # holder that has not released it.
            fenced = [str(o) for o in store.lease_info().get("fenced", [])]
            if fenced:
                _refuse_reset_under_a_holder({"owner": fenced[-1]}, sink_id, args)
        yield
    except BaseException:
        if Path(store.location, "lease.json").is_file():  # not half deleted already
            with contextlib.suppress(TxsinkError, OSError):
                store.release(Lease(owner, lease.generation))
        raise


def _refuse_reset_of_anothers_output(backend: Backend, cfg: PipelineConfig, store_dir: Path,
                                     plugins: Plugins, file: str) -> None:
    """Refuse a reset of output that another query's state owns (nothing is deleted).

    A target whose owner record names a state other than this file's (a pipeline whose
    run was refused because that target is another query's, with the same sink id and
    target name) would have that query's output deleted. Output of a state that no
    longer exists (a deleted checkpoint, this file's or another's) is what reset is
    for. Every target is asked (read-only) before anything is deleted.
    """
    from txsink.errors import SinkOwnedError

    here = str(store_dir)
    meta = plugins.state_store(here).read_meta() if (store_dir / "meta.json").is_file() \
        else None
    # No state here: a state id no owner record holds, so every claimed target answers
    # with its owner's location.
    state_id = meta.state_id if meta is not None else "txsink-reset-check"
    members = ([(f"target {m.name!r} ({m.backend.describe()})", m.backend, m.sink_id)
                for m in backend.members.values()] if isinstance(backend, TargetGroup)
               else [(backend.describe(), backend, cfg.sink.sink_id)])
    for what, b, sink_id in members:
        if type(b).reset_sink is Backend.reset_sink:
            continue  # the reset itself says this target cannot delete its output
        try:
            b.check_claim(sink_id, state_id, here)
        except SinkOwnedError as exc:
            owner = exc.owner_state or ""
            local = owner.removeprefix("file://")
            if os.path.abspath(local) == os.path.abspath(here) or (
                    "://" not in local and not Path(local, "meta.json").exists()):
                continue  # this file's state, or a state that is gone
            raise ConfigError(
                f"{what} belongs to another query, whose txsink state {owner} still exists: "
                f"txsink reset {file} would delete that query's output; "
                "nothing deleted. Give this pipeline its own sink_id and output location",
                field="sink.sink_id", sink_id=cfg.sink.sink_id) from None
        except ConfigError as exc:
            raise type(exc)(f"{what}: {exc}; nothing deleted", field=exc.field,
                            sink_id=sink_id) from None


def _refuse_reset_of_other_targets(meta: SinkMeta | None, cfg: PipelineConfig,
                                   file: str) -> None:
    """A group's reset is all-or-none over the targets its state recorded: with other
    targets in the file, one would be reset and another not, so nothing is deleted."""
    if meta is None or meta.backend != GROUP_BACKEND or meta.sink_id != cfg.sink.sink_id:
        return
    refusal = changed_targets(
        meta.targets, cfg.sink.targets, cfg.sink.sink_id, here="this file has",
        remedy=("txsink reset deletes what the recorded targets wrote: put the targets back "
                f"in {file} as the state recorded them, run `txsink reset {file}` again, "
                "then change them; nothing was deleted"))
    if refusal is not None:
        refusal.field = "sink.targets"
        raise refusal


def cmd_reset(args: argparse.Namespace) -> int:
    import shutil

    from txsink.config import load_pipeline

    cfg = load_pipeline(args.file)
    if cfg.trigger.kind == "real_time":
        return _reset_realtime(cfg, args)
    if args.source_topic:
        raise ConfigError("--source-topic: only real-time pipelines keep positions per "
                          "source topic; nothing deleted", field="--source-topic")
    checkpoint = cfg.checkpoint
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        raise ConfigError(f"checkpoint: txsink reset deletes local checkpoints only; delete "
                          f"{checkpoint} yourself", field="checkpoint")
    chk = Path(checkpoint.removeprefix("file://"))
    plugins = get_plugins()
    store_dir = chk / "txsink"
    store = None
    if (store_dir / "meta.json").is_file():
        store = plugins.state_store(str(store_dir))
        _refuse_reset_under_a_holder(store.lease_info(), cfg.sink.sink_id, args)
        _refuse_reset_of_other_targets(store.read_meta(), cfg, args.file)
    backend = cfg.create_backend(plugins)
    try:
        _refuse_reset_of_anothers_output(backend, cfg, store_dir, plugins, args.file)
        target = backend.describe()
        print(f"txsink reset deletes, for pipeline {cfg.name!r}:")
        print(f"  the output of sink {cfg.sink.sink_id!r}: {target}")
        print(f"  the checkpoint {chk} (Spark's offsets and the txsink state)")
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError("not at a terminal to ask for confirmation: pass --yes",
                                  field="--yes")
            answer = input(f"type the sink id ({cfg.sink.sink_id}) to confirm: ")
            if answer.strip() != cfg.sink.sink_id:
                print("nothing deleted")
                return EXIT_ERROR
        with _holding_for_reset(store, cfg.sink.sink_id, args):
            try:
                removed = backend.reset_sink(cfg.sink.sink_id)
            except NotImplementedError as exc:
                raise ConfigError(f"sink.backend: {exc}; nothing deleted",
                                  field="sink.backend") from None
            for line in removed:
                print(f"deleted {line}")
            if chk.exists():
                shutil.rmtree(chk)  # the lease this reset holds goes with it
                print(f"deleted checkpoint {chk}")
    finally:
        backend.close()
    print(f"sink {cfg.sink.sink_id!r} starts over at the next `txsink run {args.file}`")
    return 0


# -- backends --------------------------------------------------------------------------


#: Each capability, in words: what it means for a user when a backend has it, or not.
CAPABILITY_WORDS: dict[str, tuple[str, str]] = {
    "commit-from-any-process": (
        "the driver can finish a batch that executors wrote, also after a restart",
        "only the process that wrote a batch can commit it"),
    "list-prepared": (
        "finds and rolls back leftovers of failed tasks and stopped runs by itself",
        "cannot list leftovers: it probes for them instead"),
    "commit-marker": (
        "after a crash, the target itself records which batches were committed",
        "after a crash, only txsink's state says which batches were committed"),
    "survives-restart": (
        "prepared batches survive a restart of the target system",
        "a restart of the target system can lose prepared (not yet committed) batches"),
}


def cmd_backends(args: argparse.Namespace) -> int:
    plugins = get_plugins()
    rows = []
    for reg in plugins.backends.registrations():
        caps = sorted(c.value for c in reg.value.capabilities)
        rows.append({"backend": reg.name, "package": reg.origin.distribution or "?",
                     "version": reg.origin.version or "?", "capabilities": caps})
    broken = [{"plugin": b.name, "package": b.distribution, "error": b.error}
              for b in plugins.broken]
    if args.json:
        print(json.dumps({"backends": rows, "broken": broken}, indent=1))
        return 0
    if not rows:
        print("no backends installed")
    for r in rows:
        print(f"{r['backend']} (package {r['package']} {r['version']})")
        have = set(r["capabilities"])
        for cap, (yes, no) in CAPABILITY_WORDS.items():
            print(f"  - {yes if cap in have else no}")
    for b in broken:
        print(f"broken plugin {b['plugin']!r} from {b['package']}: {b['error']}")
    return 0


# -- status / resolve --------------------------------------------------------------------


def open_state(checkpoint: str, plugins: Plugins) -> StateStore:
    """The state under a checkpoint dir (``<dir>/txsink``), or ``<dir>`` itself."""
    base = checkpoint.rstrip("/")
    candidates = [f"{base}/txsink", base]
    for location in candidates:
        if "://" in location or Path(location, "meta.json").is_file():
            store = plugins.state_store(location)
            if store.read_meta() is not None:
                return store
    raise StateError(f"no txsink state found under {checkpoint!r} (looked for "
                     f"{candidates[0]}/meta.json and {candidates[1]}/meta.json); pass the "
                     "query's checkpointLocation")


def _parse_options(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: expected KEY=VALUE", field="--option")
        out[key.strip().lower()] = value
    return out


def _backend_for(store: StateStore, plugins: Plugins, extra: dict[str, str]) -> Backend:
    meta = store.read_meta()
    assert meta is not None
    if meta.backend == GROUP_BACKEND:
        return _group_for(meta, plugins, extra)
    options = {**meta.options, **extra}
    try:
        return plugins.create_backend(meta.backend, options)
    except ConfigError as exc:
        raise ConfigError(f"cannot rebuild backend {meta.backend!r} from the options kept in "
                          f"the state: {exc}. Secret options are not kept: pass them with "
                          "--option KEY=VALUE", field=exc.field) from None


def _group_for(meta: SinkMeta, plugins: Plugins, extra: dict[str, str]) -> Backend:
    """A group's targets, rebuilt from the state; ``--option TARGET.KEY=VALUE`` adds the
    secret options the state does not keep."""
    from txsink.group import TargetGroup
    from txsink.targets import TargetSpec

    for key in extra:
        name = key.partition(".")[0]
        if "." not in key or name not in meta.targets:
            raise ConfigError(f"--option {key}: the options of a group go to one target: "
                              f"TARGET.KEY=VALUE with TARGET one of {', '.join(meta.targets)}",
                              field="--option")
    specs = []
    for name, t in meta.targets.items():
        given = {k.partition(".")[2]: v for k, v in extra.items()
                 if k.partition(".")[0] == name}
        specs.append(TargetSpec(name, str(t["backend"]), {**dict(t.get("options", {})),
                                                          **given},
                                epoch_column=t.get("epoch_column")))
    try:
        return TargetGroup.from_specs(meta.sink_id, specs, plugins)
    except ConfigError as exc:
        raise ConfigError(f"cannot rebuild the group's targets from the options kept in the "
                          f"state: {exc}. Secret options are not kept: pass them with "
                          "--option TARGET.KEY=VALUE", field=exc.field) from None


def cmd_cut(args: argparse.Namespace) -> int:
    from txsink.config import load_pipeline
    from txsink.cut import consistent_cut

    cfg = load_pipeline(args.file)
    if cfg.trigger.kind == "real_time":
        from txsink.realtime.commands import refuse_cut

        refuse_cut(cfg, args.file)
    plugins = get_plugins()
    store = plugins.state_store(f"{cfg.checkpoint.rstrip('/')}/txsink")
    meta = store.read_meta()
    if meta is not None and meta.backend == GROUP_BACKEND and meta.sink_id == cfg.sink.sink_id:
        # A renamed target is another sink id: its target said "no epoch committed yet"
        # and the cut was -1, over a target holding every epoch.
        refusal = changed_targets(
            meta.targets, cfg.sink.targets, cfg.sink.sink_id, here="this file has",
            remedy=(f"The cut is read from the recorded targets: put them back in "
                    f"{args.file} as the state recorded them"))
        if refusal is not None:
            refusal.field = "sink.targets"
            raise refusal
    backend = cfg.create_backend(plugins)
    try:
        cut = consistent_cut(backend, store, cfg.sink.sink_id)
        describe = ({n: m.backend.describe() for n, m in backend.members.items()}
                    if isinstance(backend, TargetGroup) else
                    {cfg.sink.sink_id: backend.describe()})
    finally:
        backend.close()
    if args.json:
        print(json.dumps(cut.to_dict(), indent=1))
    else:
        for line in cut.lines(describe):
            print(line)
    return 0


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")


def _epoch_status_line(r: EpochRecord) -> str:
    """One epoch of ``txsink status``, each state as what it is: a reservation names its
    writer and since when (it is no decision), a decision when it was made, a commit how
    long it took. A group's rows are given per target: their sum counts each input row
    once per target."""
    group = any(c.target for c in r.committables)
    rows = "" if group else f", {r.rows} row(s)"
    head = f"  {r.epoch:>6}  {r.state.value:<9}  {len(r.committables)} participant(s)"
    if r.state is EpochState.RESERVED:
        what = f" for batch write {r.write}" if r.write is not None else ""
        return (f"{head} prepared so far{rows}, reserved {_when(r.decided_at)} by "
                f"{r.owner or '?'} ({_writer_words(r.owner)}){what}; not decided"
                + _per_target(r.committables))
    state = ("" if r.committed_at is not None
             else ", not committed yet" if r.state is EpochState.DECIDED else "")
    latency = ("" if r.committed_at is None
               else f", commit {1000 * (r.committed_at - r.decided_at):.0f} ms")
    return (f"{head}{rows}, decided {_when(r.decided_at)}{latency}{state}"
            + _per_target(r.committables))


def _writer_words(owner: str | None) -> str:
    """Whether the writer that reserved an epoch still runs, as far as this host knows."""
    from txsink.spark._proc import owner_alive

    alive = owner_alive(owner) if owner else None
    if alive is True:
        return "running"
    if alive is False:
        return "gone: the next start aborts what it prepared"
    return "whether it still runs is unknown from here"


def _record_json(record: EpochRecord) -> dict[str, Any]:
    reserved = record.state is EpochState.RESERVED
    data: dict[str, Any] = {
        "epoch": record.epoch, "state": record.state.value, "rows": record.rows,
        "participants": [c.participant for c in record.committables],
        "decided_at": None if reserved else record.decided_at,
        "committed_at": record.committed_at}
    if reserved:
        data["reserved_at"] = record.decided_at
        data["reserved_by"] = record.owner
    if record.write is not None:
        data["write"] = str(record.write)
    if any(c.target for c in record.committables):
        data["targets"] = {t: {"participants": [c.participant for c in cs],
                               "rows": sum(c.rows for c in cs)}
                           for t, cs in _by_target(record.committables).items()}
    if record.salvaged:
        data["salvaged"] = [{"original": o, "replacement": r} for r, o in record.salvaged]
    return data


def _by_target(committables: Sequence[Committable]) -> dict[str, list[Committable]]:
    out: dict[str, list[Committable]] = {}
    for c in committables:
        out.setdefault(c.target or "", []).append(c)
    return out


def _rows(committables: Sequence[Committable]) -> str:
    """``40 row(s)``, or for a group's participants the rows of each target
    (``events 40, totals 7 row(s)``): a sum over targets counts a row once per target."""
    if not any(c.target for c in committables):
        return f"{sum(c.rows for c in committables)} row(s)"
    return ", ".join(f"{t} {sum(c.rows for c in cs)}"
                     for t, cs in sorted(_by_target(committables).items())) + " row(s)"


def _per_target(committables: Sequence[Committable]) -> str:
    """``; events 2 (40 rows), totals 2 (7 rows)`` for a group's epoch, else nothing."""
    if not any(c.target for c in committables):
        return ""
    return "; " + ", ".join(f"{t} {len(cs)} ({sum(c.rows for c in cs)} rows)"
                            for t, cs in _by_target(committables).items())


#: Suffixes of pipeline files (``txsink run FILE``).
PIPELINE_SUFFIXES = (".yaml", ".yml", ".toml", ".json")


def _checkpoint_of(argument: str) -> str:
    """The checkpoint a ``status``/``resolve`` argument names: a pipeline file's own, or
    the argument itself (a checkpoint directory or URL)."""
    path = Path(argument)
    if path.suffix.lower() in PIPELINE_SUFFIXES and path.is_file():
        from txsink.config import load_pipeline

        return load_pipeline(argument).checkpoint
    return argument


# -- real-time pipelines (docs/realtime.md: no state, no epochs) -----------------------


def _reset_realtime(cfg: PipelineConfig, args: argparse.Namespace) -> int:
    """``txsink reset`` of a real-time pipeline: its stored positions and checkpoint."""
    from txsink.realtime.commands import reset

    return reset(cfg, args.file, get_plugins(), yes=args.yes, force=args.force,
                 source_topics=args.source_topic)


def _status_realtime(argument: str, as_json: bool) -> int | None:
    """``txsink status`` of a real-time pipeline file (``None``: not one); a real-time
    checkpoint directory is refused naming the pipeline file to give instead."""
    from txsink.realtime.commands import (
        is_realtime_checkpoint,
        realtime_file,
        refuse_status_of_checkpoint,
        status,
    )

    cfg = realtime_file(argument)
    if cfg is not None:
        return status(cfg, as_json, get_plugins())
    if is_realtime_checkpoint(argument):
        refuse_status_of_checkpoint(argument)
    return None


def _refuse_resolve_realtime(argument: str) -> None:
    """``txsink resolve`` of a real-time pipeline (its file or its checkpoint)."""
    from txsink.realtime.commands import is_realtime_checkpoint, realtime_file, refuse_resolve

    if realtime_file(argument) is not None:
        refuse_resolve(argument, argument)
    if is_realtime_checkpoint(argument):
        refuse_resolve(argument, None)


def cmd_status(args: argparse.Namespace) -> int:
    realtime = _status_realtime(args.checkpoint, args.json)
    if realtime is not None:
        return realtime
    plugins = get_plugins()
    store = open_state(_checkpoint_of(args.checkpoint), plugins)
    meta = store.read_meta()
    assert meta is not None
    records = store.records()
    in_doubt = [r for _, r in sorted(records.items()) if r.state is EpochState.DECIDED]
    decided = {c.participant for r in in_doubt for c in r.committables}
    prepared: list[Committable] | None = None
    prepared_error = ""
    open_txns: list[Mapping[str, Any]] = []
    try:
        backend = _backend_for(store, plugins, _parse_options(args.option))
        try:
            open_txns = backend.open_transactions(meta.sink_id)
            prepared = [c for c in backend.list_prepared(meta.sink_id)
                        if c.participant not in decided]
        finally:
            backend.close()
    except NotImplementedError:
        prepared_error = f"backend {meta.backend!r} cannot list prepared participants"
    except TxsinkError as exc:
        prepared_error = str(exc)
    lease = _read_lease(store)
    if args.json:
        print(json.dumps({
            "sink_id": meta.sink_id, "backend": meta.backend, "guarantee": meta.guarantee,
            "targets": {n: {"backend": t["backend"], "sink_id": t.get("sink_id")}
                        for n, t in meta.targets.items()},
            "options": {k: redact(v) for k, v in meta.options.items()},
            "state": store.location, "committed_watermark": meta.committed_watermark,
            "lease": lease, "epochs": [_record_json(r) for _, r in sorted(records.items())],
            "in_doubt": [r.epoch for r in in_doubt],
            "prepared_undecided": None if prepared is None else [
                {"participant": c.participant, "epoch": c.epoch,
                 **({"target": c.target} if c.target else {})} for c in prepared],
            "prepared_error": prepared_error or None,
            "open_transactions": open_txns,
        }, indent=1))
        return 0
    opts = ", ".join(f"{k}={redact(v)}" for k, v in sorted(meta.options.items()))
    if meta.targets:
        print(f"sink {meta.sink_id!r}: a group of {len(meta.targets)} targets, one decision "
              "per epoch:")
        for name, t in meta.targets.items():
            topts = ", ".join(f"{k}={redact(str(v))}"
                              for k, v in sorted(dict(t.get("options", {})).items()))
            print(f"  target {name}: backend {t['backend']}, sink id {t.get('sink_id')} "
                  f"({topts})")
    else:
        print(f"sink {meta.sink_id!r}: backend {meta.backend} ({opts})")
    print(f"state: {store.location}")
    guarantee = DeliveryGuarantee.parse(meta.guarantee)
    print(f"guarantee: {guarantee.reader_note()}")
    if lease:
        print(f"lease: {_lease_words(lease)}")
    print(f"committed up to epoch {meta.committed_watermark} (records pruned below that "
          "are committed)" if meta.committed_watermark >= 0 else "nothing committed yet")
    if records:
        print("epochs:")
        for _, r in sorted(records.items()):
            print(_epoch_status_line(r))
    salvaged = [(r, pair) for _, r in sorted(records.items()) for pair in r.salvaged]
    if salvaged:
        print("salvaged (the target aborted these decided participants on its own; their "
              "rows were written again from what it kept, under the new name):")
        for r, (replacement, original) in salvaged:
            rows = next((c.rows for c in r.committables if c.participant == replacement), None)
            print(f"  epoch {r.epoch}: {original} -> {replacement}"
                  + (f" ({rows} rows, {r.state.value})" if rows is not None
                     else " (salvaged again since)"))
    if in_doubt:
        print("in doubt (DECIDED, not yet committed; a restart or `txsink resolve --commit` "
              "commits them):")
        for r in in_doubt:
            for c in r.committables:
                where = f"target {c.target}: " if c.target else ""
                print(f"  epoch {r.epoch}: {where}{c.participant} ({c.rows} rows)")
    else:
        print("in doubt: none")
    if prepared is None:
        print(f"pending participants: unknown ({prepared_error})")
    elif prepared:
        print("pending (prepared, no decision holds them; aborted at the next start, or by "
              "`txsink resolve --abort`):")
        for c in prepared:
            where = f"target {c.target}: " if c.target else ""
            print(f"  epoch {c.epoch}: {where}{c.participant}")
    else:
        print("pending: none")
    if open_txns:
        print(f"open in {meta.backend} (`txsink resolve --epoch N --abort` ends pending "
              "ones, `--commit` in-doubt ones):")
        for row in open_txns:
            print(f"  {row['summary']}")
    return 0


def _read_lease(store: StateStore) -> dict[str, Any] | None:
    try:
        data = store.lease_info()
    except TxsinkError:
        return None
    if not data:
        return None
    from txsink.spark._proc import owner_alive

    data = dict(data)
    released = data.get("released_at") is not None
    alive = None if released else owner_alive(str(data.get("owner", "")))
    data["held"] = not released
    data["holder_running"] = alive
    return data


def _lease_words(lease: dict[str, Any]) -> str:
    """Whether a query holds the sink, in words: released, held by a live run (or a
    ``txsink run`` still starting Spark, or a ``reset`` deleting), or stale."""
    from txsink.spark._proc import owner_words

    owner = str(lease.get("owner"))
    who = f"{owner}, generation {lease.get('generation')}"
    since = _when(lease.get("acquired_at"))
    if not lease["held"]:
        return (f"released at {_when(lease.get('released_at'))} (the last run ended; {who}); "
                "no query writes this sink now")
    if lease.get("holder_running") is True:
        if ":run:" in owner:
            return (f"held since {since} by {owner_words(owner)}, which is starting Spark "
                    f"or running its query ({who}); stop it (Ctrl-C) before `txsink reset` "
                    "or `resolve`")
        if ":reset:" in owner:
            return (f"held since {since} by {owner_words(owner)}, which is deleting this "
                    f"pipeline's output and checkpoint ({who})")
        return (f"held by a running query since {since} ({who}); "
                "stop it before `txsink resolve`")
    if lease.get("holder_running") is False:
        what = (f"by {owner_words(owner)}, which ended" if ":run:" in owner or
                ":reset:" in owner else "by a driver that is gone")
        return (f"held since {since} {what} ({who}): it stopped without releasing it (crash "
                "or kill, also while Spark was starting); nothing of it runs, and the next "
                "run, reset or resolve takes it over")
    return (f"held since {since} ({who}); whether that query still runs is unknown from "
            "here")


def _force_abort(coordinator: Coordinator, backend: Backend, store: StateStore,
                 record: EpochRecord) -> None:
    """Give a DECIDED epoch up, telling the truth about what stays visible.

    A participant the target shows committed cannot be taken back: it is kept, the
    state remembers its partition (a replay of the epoch does not write it again), and
    the message counts its rows as visible, not as dropped.
    """
    import dataclasses

    sink = coordinator.sink_id
    committed: list[Committable] = []
    dropped: list[Committable] = []
    unknown: list[Committable] = []
    for c in record.committables:
        state = backend.is_committed(c)
        if state:
            committed.append(c)
            continue
        # Undone where the target can (a native participant published in part is
        # unpublished); what it cannot undo is said to be unknown, never "dropped".
        (dropped if backend.take_back(c) else unknown).append(c)
    if committed:
        meta = store.read_meta()
        assert meta is not None
        epoch = record.epoch
        if record.write is not None:
            # Its replay finds the epoch (and what was kept of it) by its identity.
            meta = dataclasses.replace(
                meta, kept_writes={**meta.kept_writes,
                                   str(record.write): (epoch, record.write.query_id)})
        # A replay of this epoch decided only the partitions an earlier forced resolve
        # did not keep: what both kept, and the rows of every partition, add up.
        rows = {**layout(record.committables), **meta.kept_rows.get(epoch, {})}
        meta = dataclasses.replace(meta, kept_rows={**meta.kept_rows, epoch: rows})
        if any(c.target for c in committed):
            by_target = dict(meta.kept_targets.get(epoch, {}))
            for t, cs in _by_target(committed).items():
                by_target[t] = tuple(sorted({*by_target.get(t, ()), *(c.partition for c in cs)}))
            store.write_meta(coordinator.lease, dataclasses.replace(
                meta, kept_targets={**meta.kept_targets, epoch: by_target}))
        else:
            partitions = set(meta.kept.get(epoch, ())) | {c.partition for c in committed}
            kept = {**meta.kept, epoch: tuple(sorted(partitions))}
            store.write_meta(coordinator.lease, dataclasses.replace(meta, kept=kept))
    # The number is given up for good: no later write is allocated it (it may hold
    # rows in some targets now).
    coordinator.epochs.give_up([record.epoch])
    parts = [f"aborted DECIDED epoch {record.epoch} of sink {sink!r} (--force):"]
    if committed:
        parts.append(
            f"{len(committed)} participant(s) ({_rows(committed)}) were "
            "committed already and stay visible; when Spark replays the epoch, their "
            f"partitions ({', '.join(_where(c) for c in committed)}) are not "
            "written again;")
    parts.append(f"{len(dropped)} participant(s), {_rows(dropped)} "
                 "dropped" + (";" if unknown else ""))
    if unknown:
        parts.append(f"{len(unknown)} participant(s) ({_rows(unknown)}) "
                     f"rolled back where {backend.name} cannot tell whether they were "
                     "committed before (check the output)")
    print(" ".join(parts))
    log.warning("sink=%s epoch=%d: decided epoch given up by resolve --force: %d "
                "participant(s) kept committed, %d dropped, %d unknown", sink, record.epoch,
                len(committed), len(dropped), len(unknown))


def _where(c: Committable) -> str:
    return f"{c.target} {c.partition}" if c.target else str(c.partition)


def _drop_reservation(coordinator: Coordinator, store: StateStore, epoch: int) -> None:
    """The RESERVED record of a batch or grouped write that died before its decision:
    its participants are rolled back, so the epoch is given up (the resolve owns the
    lease now; the dead writer, if it came back, is fenced). Its number is remembered as
    given up, so no later write is allocated it while a participant the fenced writer
    prepared after this abort may still carry it."""
    coordinator.epochs.give_up([epoch])


def _release_own_lease(store: StateStore, owner: str) -> None:
    """``resolve`` is not a query: once done it gives the lease up, so ``status`` does
    not read it as held by a driver that is gone, and the next run takes it plainly."""
    info = store.lease_info()
    if owner and info.get("owner") == owner and info.get("released_at") is None:
        from txsink.state import Lease

        with contextlib.suppress(TxsinkError, OSError):
            store.release(Lease(owner, int(info["generation"])))


def _epoch_number(text: str) -> int:
    """``--epoch``: a whole number >= 0 (epochs start at 0; -1 was answered "committed")."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an epoch: give a whole number >= 0 (`txsink status` lists them)")
    return value


def _refuse_resolve_under_a_holder(store: StateStore, sink_id: str) -> None:
    """``resolve`` takes the lease over: never from a query that runs on this host (a
    ``txsink run`` still starting Spark included), which it would fail mid-epoch."""
    from txsink.spark._proc import lease_holder, owner_words

    lease = store.lease_info()
    if lease_holder(lease) != "running":
        return
    owner = str(lease["owner"])
    what = ("starting Spark, or running its query" if ":run:" in owner else
            "deleting this pipeline's output and checkpoint" if ":reset:" in owner else
            "running")
    raise StateError(
        f"sink {sink_id!r} is held by {owner_words(owner)}, {what} (lease owner {owner}); "
        "resolve would take the lease over and fail it: stop it first (Ctrl-C); nothing "
        "was done", sink_id=sink_id)


def cmd_resolve(args: argparse.Namespace) -> int:
    _refuse_resolve_realtime(args.checkpoint)
    plugins = get_plugins()
    store = open_state(args.checkpoint, plugins)
    meta = store.read_meta()
    assert meta is not None
    _refuse_resolve_under_a_holder(store, meta.sink_id)
    epoch: int = args.epoch
    backend = _backend_for(store, plugins, _parse_options(args.option))
    coordinator_owner = ""
    try:
        coordinator = Coordinator(backend, store, meta.sink_id, backend_options=meta.options,
                                  plugins=plugins, scan_orphans=False)
        coordinator_owner = coordinator.owner
        record = store.get(epoch)
        reserved = record if record is not None and record.state is EpochState.RESERVED \
            else None
        if reserved is not None:
            record = None  # a batch write's reservation: nothing was decided
        if record is None and epoch <= meta.committed_watermark:
            print(f"epoch {epoch} of sink {meta.sink_id!r} is committed; nothing to do")
            return 0
        if record is None:
            try:
                mine = [c for c in backend.list_prepared(meta.sink_id) if c.epoch == epoch]
            except NotImplementedError:
                mine = None
            if mine == []:
                known = sorted(store.records())
                span = (f"epochs {known[0]}-{known[-1]}" if len(known) > 1 else
                        f"epoch {known[0]}" if known else "no epoch records")
                raise StateError(
                    f"epoch {epoch} of sink {meta.sink_id!r} does not exist: the state holds "
                    f"{span} (committed up to {meta.committed_watermark}) and no prepared "
                    f"participant has epoch {epoch}; `txsink status {args.checkpoint}` lists "
                    "them", sink_id=meta.sink_id, epoch=epoch)
        if args.commit:
            if record is None:
                raise StateError(
                    f"epoch {epoch} of sink {meta.sink_id!r} was never decided: its prepared "
                    "participants may be incomplete and can only be aborted "
                    f"(txsink resolve {args.checkpoint} --epoch {epoch} --abort)",
                    sink_id=meta.sink_id, epoch=epoch)
            if record.state is EpochState.COMMITTED:
                print(f"epoch {epoch} of sink {meta.sink_id!r} is already committed")
                return 0
            coordinator.start(recover=False)
            coordinator.commit_epoch(epoch, list(record.committables))
            print(f"committed epoch {epoch} of sink {meta.sink_id!r}: "
                  f"{len(record.committables)} participant(s), {_rows(record.committables)}")
            return 0
        # --abort
        if record is not None and record.state is EpochState.COMMITTED:
            raise StateError(f"epoch {epoch} of sink {meta.sink_id!r} is committed; it "
                             "cannot be aborted", sink_id=meta.sink_id, epoch=epoch)
        if record is not None:
            if not args.force:
                raise StateError(
                    f"epoch {epoch} of sink {meta.sink_id!r} is DECIDED: Spark may already "
                    "consider it written, so committing it (--commit) is the only way to "
                    "keep exactly-once. --force aborts it and its output is lost",
                    sink_id=meta.sink_id, epoch=epoch)
            coordinator.start(recover=False)
            _force_abort(coordinator, backend, store, record)
            return 0
        coordinator.start(recover=False)
        try:
            mine = [c for c in backend.list_prepared(meta.sink_id) if c.epoch == epoch]
        except NotImplementedError:
            mine = []
        if reserved is not None:  # what the write recorded, also where nothing lists it
            listed = {(c.target, c.participant) for c in mine}
            mine += [c for c in reserved.committables
                     if (c.target, c.participant) not in listed]
        coordinator.abort_epoch(epoch, mine)
        dropped = ""
        if reserved is not None and store.get(epoch) is not None:
            _drop_reservation(coordinator, store, epoch)
            dropped = "; the reservation of the write that did not finish is dropped"
        print(f"aborted epoch {epoch} of sink {meta.sink_id!r}: {len(mine)} prepared "
              f"participant(s) rolled back{dropped}")
        return 0
    finally:
        backend.close()
        _release_own_lease(store, coordinator_owner)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
