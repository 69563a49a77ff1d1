"""The S3 state store on a real S3-compatible server: the shared state-store suite,
plus what only S3 has (the conditional-write probe, the head object, garbage)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from txsink.errors import ConfigError, FencedError, StateError
from txsink.plugins import get_plugins
from txsink.state import EpochState
from txsink.testing.state_store import StateStoreContract, decided
from txsink_s3 import state as s3state
from txsink_s3.state import S3StateStore, parse_location

from .conftest import S3Server

pytestmark = pytest.mark.integration


@pytest.fixture
def aws_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The standard AWS settings the store reads (spawned drivers inherit them)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    if s3_server.access_key is not None and s3_server.secret_key is not None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    return s3_server


class TestS3StateStore(StateStoreContract):
    @pytest.fixture
    def location(self, aws_env: S3Server, prefix: str) -> str:
        return f"s3://{aws_env.bucket}/{prefix}/chk/txsink"


def _store(server: S3Server, prefix: str, client: Any = None) -> S3StateStore:
    return S3StateStore(f"s3://{server.bucket}/{prefix}/state",
                        client=client or server.client())


def test_s3a_locations_open_the_s3_store(aws_env: S3Server, prefix: str) -> None:
    store = get_plugins().state_store(f"s3a://{aws_env.bucket}/{prefix}/chk/txsink")
    assert isinstance(store, S3StateStore)
    lease = store.acquire("a")
    store.put(lease, decided(0))
    # Spark's s3a:// and boto3's s3:// name the same objects.
    same = get_plugins().state_store(f"s3://{aws_env.bucket}/{prefix}/chk/txsink")
    assert same.records() == {0: decided(0)}


@pytest.mark.parametrize(("location", "message"), [
    ("s3://", "valid bucket"),
    ("s3://UPPER/x", "valid bucket"),
    ("s3://bucket/a/../b", "'..'"),
    ("gs://bucket/x", "s3://bucket/prefix"),
])
def test_bad_locations_are_refused_before_any_request(location: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_location(location)
    assert info.value.field == "state_location"


@pytest.mark.promise("s3-state-needs-conditional-writes", "backend")
def test_an_endpoint_ignoring_conditional_writes_is_refused(
        s3_server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real server behind a client that drops If-Match/If-None-Match, as an old
    gateway or server would: the store must refuse it, not run unfenced."""
    client = s3_server.client()

    def drop_conditions(request: Any, **_: Any) -> None:
        for header in ("If-Match", "If-None-Match"):
            if header in request.headers:
                del request.headers[header]

    client.meta.events.register("before-sign.s3.PutObject", drop_conditions)
    monkeypatch.setattr(s3state, "_probed", set())
    store = _store(s3_server, prefix, client)
    with pytest.raises(ConfigError, match="does not honour conditional writes") as info:
        store.acquire("a")
    assert info.value.field == "state_location"
    assert s3_server.keys(f"{prefix}/") == []  # refused before writing any state


def test_missing_bucket_is_a_config_error(s3_server: S3Server,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3state, "_probed", set())
    store = S3StateStore(f"s3://no-such-{uuid.uuid4().hex[:8]}/x", client=s3_server.client())
    with pytest.raises(ConfigError, match="does not exist"):
        store.acquire("a")


def test_each_change_is_one_conditional_head_write_and_records_are_immutable(
        s3_server: S3Server, prefix: str) -> None:
    store = _store(s3_server, prefix)
    lease = store.acquire("a")
    store.put(lease, decided(5, partitions=3))
    store.put(lease, decided(5, partitions=3).committed(2.0))
    keys = s3_server.keys(f"{prefix}/state/")
    # Marking COMMITTED reuses the record object: only the head changed.
    assert sorted(k.rsplit("/", 2)[-2] for k in keys) == ["records", "state"]
    head = json.loads(s3_server.client().get_object(
        Bucket=s3_server.bucket, Key=f"{prefix}/state/head.json")["Body"].read())
    assert head["lease"]["owner"] == "a" and head["seq"] == 3
    assert head["epochs"]["5"]["state"] == "committed"
    assert "committables" not in json.dumps(head)  # the head stays small
    store.delete(lease, [5])
    assert s3_server.keys(f"{prefix}/state/records/") == []


def test_a_fenced_decision_leaves_no_object_behind(s3_server: S3Server, prefix: str) -> None:
    old_store, new_store = _store(s3_server, prefix), _store(s3_server, prefix)
    old = old_store.acquire("old")
    old_store.put(old, decided(0, owner="old"))
    new_store.acquire("new")
    with pytest.raises(FencedError):
        old_store.put(old, decided(1, owner="old"))
    # A record object written by a driver that crashed before linking it is swept
    # when the next owner takes the lease.
    stray = f"{prefix}/state/records/{1:012d}-{uuid.uuid4().hex}.json"
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=stray, Body=b"{}")
    _store(s3_server, prefix).acquire("third")
    assert len(s3_server.keys(f"{prefix}/state/records/")) == 1  # epoch 0's only


def test_a_coordinator_taken_over_during_its_sweep_deletes_nothing(
        s3_server: S3Server, prefix: str) -> None:
    """Operations hole 6: after taking the lease, a coordinator sweeps record objects no
    decision links. If it is itself taken over during a slow LIST (two racing
    restarts, ``txsink resolve`` racing a restart), the new owner's DECIDED record
    appears in the listing but not in the head the sweep read first: it was deleted,
    and the decided epoch could never be committed again. A fenced process must
    change nothing."""
    first = _store(s3_server, prefix)
    first.put(first.acquire("first"), decided(0, owner="first"))
    newer = _store(s3_server, prefix)
    taken: list[Any] = []

    def takeover_during_list(**_: Any) -> None:
        if not taken:  # once: the newer run takes the lease and decides an epoch
            lease = newer.acquire("newer")
            newer.put(lease, decided(1, owner="newer"))
            taken.append(lease)

    client = s3_server.client()
    client.meta.events.register("before-call.s3.ListObjectsV2", takeover_during_list)
    slow = _store(s3_server, prefix, client)
    with pytest.raises(FencedError):
        slow.acquire("slow")  # takes the lease from "first", then is taken over
    assert taken
    reader = _store(s3_server, prefix)
    assert reader.records() == {0: decided(0, owner="first"), 1: decided(1, owner="newer")}
    reader.acquire("newer")  # the newer run goes on, its decision intact


def test_a_corrupt_head_is_reported(s3_server: S3Server, prefix: str) -> None:
    store = _store(s3_server, prefix)
    store.put(store.acquire("a"), decided(0))
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=f"{prefix}/state/head.json",
                                  Body=b"{not json")
    with pytest.raises(StateError, match="corrupt"):
        _store(s3_server, prefix).records()


def test_no_secret_reaches_the_state(aws_env: S3Server, prefix: str) -> None:
    store = get_plugins().state_store(f"s3://{aws_env.bucket}/{prefix}/state")
    store.put(store.acquire("a"), decided(0))
    client = aws_env.client()
    for key in aws_env.keys(f"{prefix}/state/"):
        body = client.get_object(Bucket=aws_env.bucket, Key=key)["Body"].read().decode()
        assert aws_env.secret_key is None or aws_env.secret_key not in body


def test_states_come_from_the_head_alone(s3_server: S3Server, prefix: str) -> None:
    """The coordinator asks for states() on every commit: reading every retained
    record object would make a commit's cost grow with the epochs kept."""
    store = _store(s3_server, prefix)
    lease = store.acquire("a")
    for epoch in range(4):
        store.put(lease, decided(epoch, partitions=2))
    store.put(lease, decided(1, partitions=2).committed(2.0))
    client = s3_server.client()
    fetched: list[str] = []
    client.meta.events.register(
        "provide-client-params.s3.GetObject",
        lambda params, **_: fetched.append(str(params["Key"])))  # type: ignore[no-untyped-def]
    fresh = _store(s3_server, prefix, client)  # caches nothing yet
    states = fresh.states()
    assert states == {0: EpochState.DECIDED, 1: EpochState.COMMITTED,
                      2: EpochState.DECIDED, 3: EpochState.DECIDED}
    assert fetched == [f"{prefix}/state/head.json"]
    assert states == {e: r.state for e, r in fresh.records().items()}
