from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from txsink.errors import ConfigError, StateError
from txsink.model import (
    Committable,
    TransactionContext,
    parse_participant,
    participant_name,
    validate_sink_id,
)
from txsink.options import Options, Secret
from txsink.redact import redact


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "a b", "x%", "_lead", "a*", "é", "a" * 65,
                                 "a\\b", "a.b"])
def test_unsafe_sink_ids_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_sink_id(bad)
    assert info.value.field == "sink_id"


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True),
       st.integers(0, 10**9), st.integers(0, 10**5), st.integers(0, 100))
def test_participant_names_parse_back(sink: str, epoch: int, part: int, attempt: int) -> None:
    ctx = parse_participant(participant_name(sink, epoch, part, attempt))
    assert ctx == TransactionContext(sink, epoch, part, attempt)


@pytest.mark.promise("newer-committable-refused", "backend")
def test_committable_round_trip_and_versioning() -> None:
    ctx = TransactionContext("s", 3, 1, 2)
    c = Committable.for_context("files", ctx, {"k": [1, "x"]}, rows=5)
    assert Committable.from_bytes(c.to_bytes()) == c
    data = c.to_dict()
    data["v"] = 2
    with pytest.raises(StateError, match="version 2"):
        Committable.from_dict(data)
    with pytest.raises(StateError, match="malformed"):
        Committable.from_dict({"v": 1, "backend": "x"})


def test_options_name_the_field_and_hide_secrets() -> None:
    opts = Options({"part_size": "abc", "password": "s3cret!", "typo_option": "1"},
                   owner="test backend", secret_keys=["password"], prefix="sink.options.")
    with pytest.raises(ConfigError) as info:
        opts.int("part_size", 5)
    assert info.value.field == "sink.options.part_size"
    assert "'abc'" in str(info.value)
    secret = opts.secret("password")
    assert secret is not None and secret.reveal() == "s3cret!"
    assert "s3cret" not in repr(secret) and "s3cret" not in str(secret)
    with pytest.raises(ConfigError, match="typo_option"):
        opts.check_unknown()


def test_options_bounds_and_choices() -> None:
    opts = Options({"n": "3", "fmt": "XML", "flag": "maybe"}, owner="b")
    with pytest.raises(ConfigError, match="at least 5"):
        opts.int("n", 10, minimum=5)
    with pytest.raises(ConfigError, match="one of parquet, jsonl"):
        opts.choice("fmt", ["parquet", "jsonl"], "parquet")
    with pytest.raises(ConfigError, match="true or false"):
        opts.bool("flag", False)
    with pytest.raises(ConfigError, match="'missing' is required"):
        opts.str("missing", required=True)


def test_redact() -> None:
    text = "connect postgresql://bob:pa55w0rd@db/x password=hunter2 token abcd1234"
    out = redact(text, ["abcd1234"])
    assert "pa55w0rd" not in out and "hunter2" not in out and "abcd1234" not in out
    assert "bob" in out and Secret("x") == Secret("x")
