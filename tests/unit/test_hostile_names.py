"""Names users control must not smuggle in paths, wildcards or sizes that break things.

Refused up front, by option parsing, before any connection or write.
"""

from __future__ import annotations

import pytest
from txsink.errors import ConfigError
from txsink.model import validate_sink_id
from txsink.plugins import get_plugins

BAD_SINK_IDS = ["../x", "a/b", "a\\b", "a*", "a?", "a%", "a b", "-x", "x" * 65, "a\x00b"]


@pytest.mark.parametrize("sink_id", BAD_SINK_IDS)
def test_sink_ids_with_separators_wildcards_or_overlong_are_refused(sink_id: str) -> None:
    with pytest.raises(ConfigError):
        validate_sink_id(sink_id)


@pytest.mark.parametrize("prefix", ["../up", "a/./b", "a*/b", "logs/[0-9]", "x" * 600,
                                    "a\nb"])
def test_s3_prefix_is_refused(prefix: str) -> None:
    pytest.importorskip("txsink_s3", reason="txsink-s3 is not installed")
    with pytest.raises(ConfigError) as info:
        get_plugins().create_backend("s3", {"bucket": "bkt", "prefix": prefix})
    assert info.value.field == "prefix"


@pytest.mark.parametrize("prefix", ["a/b", "a*", "a%b", "x" * 101])
def test_kafka_transactional_id_prefix_is_refused(prefix: str) -> None:
    pytest.importorskip("txsink_kafka", reason="txsink-kafka is not installed")
    with pytest.raises(ConfigError) as info:
        get_plugins().create_backend("kafka", {"kafka.bootstrap.servers": "127.0.0.1:9",
                                               "topic": "t",
                                               "transactional.id.prefix": prefix})
    assert info.value.field == "transactional.id.prefix"


@pytest.mark.parametrize("table", ["a.b.c", "db.public.t", 'public."unclosed', ""])
def test_postgres_table_names_that_are_not_names_are_refused(table: str) -> None:
    # Names are always quoted through psycopg.sql, so SQL inside one is just a name
    # (tests/integration/test_security.py shows it on a real server).
    pytest.importorskip("txsink_postgres", reason="txsink-postgres is not installed")
    with pytest.raises(ConfigError) as info:
        get_plugins().create_backend("postgres", {"dsn": "host=127.0.0.1", "table": table})
    assert info.value.field == "table"


def test_files_backend_refuses_non_local_paths() -> None:
    with pytest.raises(ConfigError) as info:
        get_plugins().create_backend("files", {"path": "s3://bucket/x"})
    assert info.value.field == "path"
