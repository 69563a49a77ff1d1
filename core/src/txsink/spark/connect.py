"""Spark Connect for ``txsink run --remote`` / ``SPARK_REMOTE``.

The server is reached (within txsink's bound, not PySpark's ten-minute retries)
before the run takes the checkpoint's lease, so a mistyped address never fences a
healthy query. The run's lease owner is a token of this client process, handed to
the data source in the server as an option. Errors of the Connect client are told
apart: a server gone (the query's fate unknown here) from an error the server
answered with.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from txsink.config import PipelineConfig
from txsink.errors import ConfigError
from txsink.spark.messages import first_lines
from txsink.spark.report import Printer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


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
                          f"address: {first_lines(str(exc))}", field="--remote") from None
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
        if not is_connect_error(exc):
            raise
        raise ConfigError(f"--remote / SPARK_REMOTE: the Spark Connect server at {remote} "
                          f"did not open a session: {first_lines(str(exc))}",
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


#: Spark's words for a streaming query whose checkpoint another active query uses.
IN_USE_WORDS = ("already active", "CONCURRENT_QUERY", "ConcurrentModification")


def server_gone(exc: BaseException) -> bool:
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


def is_connect_error(exc: BaseException) -> bool:
    """An error of the Spark Connect client (PySpark's errors, gRPC's)."""
    module = type(exc).__module__
    return module.startswith(("pyspark.errors", "grpc"))


def is_remote(frame: DataFrame) -> bool:
    """A Spark Connect frame: its JVM is the server's, never this run's to kill."""
    return type(frame).__module__.startswith("pyspark.sql.connect")


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
