"""The ``txsink`` command line: run and validate pipelines, inspect and resolve sinks.

A :class:`~txsink.errors.TxsinkError` is printed as one message (no stack trace)
and the exit status is non-zero; anything else is a bug and keeps its traceback.
Spark is imported only by ``run``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from txsink.backend import Backend
from txsink.errors import ConfigError, StateError, TxsinkError
from txsink.model import Committable, DeliveryGuarantee
from txsink.plugins import Plugins, get_plugins
from txsink.redact import redact
from txsink.state import EpochRecord, EpochState, StateStore

log = logging.getLogger(__name__)

EXIT_ERROR = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        code: int = args.func(args)
        return code
    except TxsinkError as exc:
        field = getattr(exc, "field", None)
        prefix = "config error" if isinstance(exc, ConfigError) else "error"
        message = str(exc)
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
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a pipeline file on Spark",
                         description="Validate FILE, then run it on Spark and print each "
                         "committed batch (rows, participants, commit latency).")
    run.add_argument("file", help="pipeline file (.yaml, .yml or .toml)")
    run.add_argument("--max-batches", type=_positive_int, metavar="N",
                     help="stop after N micro-batches (demos, tests)")
    run.add_argument("--until-idle", action="store_true",
                     help="stop once the source has no new data")
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="stop after SECONDS")
    run.add_argument("--metrics-port", type=int, metavar="PORT",
                     help="serve Prometheus metrics at http://HOST:PORT/metrics while the "
                     "pipeline runs (needs txsink[metrics])")
    run.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                     help="address the metrics endpoint binds to (default: 127.0.0.1)")
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check a pipeline file without running it",
                              description="Load FILE, resolve ${ENV} references and check "
                              "every field and the backend's options. Starts no Spark.")
    validate.add_argument("file")
    validate.set_defaults(func=cmd_validate)

    backends = sub.add_parser("backends", help="list installed backends")
    backends.add_argument("--json", action="store_true", help="machine-readable output")
    backends.set_defaults(func=cmd_backends)

    status = sub.add_parser(
        "status", help="show a sink's epochs and pending/in-doubt participants",
        description="Read the coordinator state under CHECKPOINT_DIR (a query's "
        "checkpointLocation, or its txsink/ subdirectory) and list epochs, in-doubt "
        "(DECIDED, not yet committed) epochs and prepared participants no decision holds.")
    status.add_argument("checkpoint", metavar="CHECKPOINT_DIR")
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
    resolve.add_argument("--epoch", type=int, required=True)
    action = resolve.add_mutually_exclusive_group(required=True)
    action.add_argument("--commit", action="store_true")
    action.add_argument("--abort", action="store_true")
    resolve.add_argument("--force", action="store_true",
                         help="allow aborting a DECIDED epoch (its output is lost)")
    resolve.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                         help="backend option not kept in the state (e.g. a password)")
    resolve.set_defaults(func=cmd_resolve)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# -- run / validate ------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from txsink.config import load_pipeline

    cfg = load_pipeline(args.file)
    print(f"ok: {cfg.summary()}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from txsink.config import load_pipeline

    cfg = load_pipeline(args.file)  # every config error surfaces here, before Spark
    try:
        from txsink.spark.pipeline import run_pipeline
    except ImportError as exc:
        raise ConfigError(f"`txsink run` needs PySpark: pip install 'txsink[spark]' ({exc})"
                          ) from None
    server = None
    if args.metrics_port is not None:
        from txsink import metrics

        # Before Spark starts: its Python workers, where the coordinator runs,
        # inherit the metrics directory through the driver JVM's environment.
        server = metrics.serve(args.metrics_port, args.metrics_host)
        print(f"metrics: {server.url}", flush=True)
    try:
        run_pipeline(cfg, max_batches=args.max_batches, until_idle=args.until_idle,
                     timeout_s=args.timeout)
    finally:
        if server is not None:
            server.close()
    return 0


# -- backends --------------------------------------------------------------------------


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
    width = max([len(r["backend"]) for r in rows] + [7])
    pwidth = max([len(f"{r['package']} {r['version']}") for r in rows] + [7])
    for r in rows:
        pkg = f"{r['package']} {r['version']}"
        print(f"{r['backend']:<{width}}  {pkg:<{pwidth}}  {', '.join(r['capabilities'])}")
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
    options = {**meta.options, **extra}
    try:
        return plugins.create_backend(meta.backend, options)
    except ConfigError as exc:
        raise ConfigError(f"cannot rebuild backend {meta.backend!r} from the options kept in "
                          f"the state: {exc}. Secret options are not kept: pass them with "
                          "--option KEY=VALUE", field=exc.field) from None


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")


def _record_json(record: EpochRecord) -> dict[str, Any]:
    return {"epoch": record.epoch, "state": record.state.value, "rows": record.rows,
            "participants": [c.participant for c in record.committables],
            "decided_at": record.decided_at, "committed_at": record.committed_at}


def cmd_status(args: argparse.Namespace) -> int:
    plugins = get_plugins()
    store = open_state(args.checkpoint, plugins)
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
            "options": {k: redact(v) for k, v in meta.options.items()},
            "state": store.location, "committed_watermark": meta.committed_watermark,
            "lease": lease, "epochs": [_record_json(r) for _, r in sorted(records.items())],
            "in_doubt": [r.epoch for r in in_doubt],
            "prepared_undecided": None if prepared is None else [
                {"participant": c.participant, "epoch": c.epoch} for c in prepared],
            "prepared_error": prepared_error or None,
            "open_transactions": open_txns,
        }, indent=1))
        return 0
    opts = ", ".join(f"{k}={redact(v)}" for k, v in sorted(meta.options.items()))
    print(f"sink {meta.sink_id!r}: backend {meta.backend} ({opts})")
    print(f"state: {store.location}")
    guarantee = DeliveryGuarantee.parse(meta.guarantee)
    print(f"guarantee: {guarantee.reader_note()}")
    if lease:
        print(f"lease: {lease.get('owner')} (generation {lease.get('generation')})")
    print(f"committed up to epoch {meta.committed_watermark} (records pruned below that "
          "are committed)" if meta.committed_watermark >= 0 else "nothing committed yet")
    if records:
        print("epochs:")
        for epoch, r in sorted(records.items()):
            latency = ("" if r.committed_at is None
                       else f", commit {1000 * (r.committed_at - r.decided_at):.0f} ms")
            print(f"  {epoch:>6}  {r.state.value:<9}  {len(r.committables)} participant(s), "
                  f"{r.rows} row(s), decided {_when(r.decided_at)}{latency}")
    if in_doubt:
        print("in doubt (DECIDED, not yet committed; a restart or `txsink resolve --commit` "
              "commits them):")
        for r in in_doubt:
            for c in r.committables:
                print(f"  epoch {r.epoch}: {c.participant} ({c.rows} rows)")
    else:
        print("in doubt: none")
    if prepared is None:
        print(f"pending participants: unknown ({prepared_error})")
    elif prepared:
        print("pending (prepared, no decision holds them; aborted at the next start, or by "
              "`txsink resolve --abort`):")
        for c in prepared:
            print(f"  epoch {c.epoch}: {c.participant}")
    else:
        print("pending: none")
    if open_txns:
        print(f"open in {meta.backend} (`txsink resolve --epoch N --abort` ends pending "
              "ones, `--commit` in-doubt ones):")
        for row in open_txns:
            print(f"  {row['summary']}")
    return 0


def _read_lease(store: StateStore) -> dict[str, Any] | None:
    path = Path(store.location, "lease.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cmd_resolve(args: argparse.Namespace) -> int:
    from txsink.coordinator import Coordinator

    plugins = get_plugins()
    store = open_state(args.checkpoint, plugins)
    meta = store.read_meta()
    assert meta is not None
    epoch: int = args.epoch
    backend = _backend_for(store, plugins, _parse_options(args.option))
    try:
        coordinator = Coordinator(backend, store, meta.sink_id, backend_options=meta.options,
                                  plugins=plugins, scan_orphans=False)
        record = store.get(epoch)
        if record is not None and record.state is EpochState.RESERVED:
            record = None  # a batch write's reservation: nothing was decided
        if record is None and epoch <= meta.committed_watermark:
            print(f"epoch {epoch} of sink {meta.sink_id!r} is committed; nothing to do")
            return 0
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
                  f"{len(record.committables)} participant(s), {record.rows} row(s)")
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
            for c in record.committables:
                backend.abort(c)
            store.delete(coordinator.lease, [epoch])
            print(f"aborted DECIDED epoch {epoch} of sink {meta.sink_id!r} (--force): "
                  f"{len(record.committables)} participant(s), {record.rows} row(s) dropped")
            return 0
        coordinator.start(recover=False)
        try:
            mine = [c for c in backend.list_prepared(meta.sink_id) if c.epoch == epoch]
        except NotImplementedError:
            mine = []
        coordinator.abort_epoch(epoch, mine)
        print(f"aborted epoch {epoch} of sink {meta.sink_id!r}: {len(mine)} prepared "
              "participant(s) rolled back")
        return 0
    finally:
        backend.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
