"""Sink-id ownership on S3: of two queries claiming one sink id at once, exactly one wins."""

from __future__ import annotations

import json
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from txsink.errors import ConfigError, SinkOwnedError
from txsink.group import TargetGroup
from txsink.targets import parse_targets
from txsink_s3 import backend as s3backend
from txsink_s3.backend import S3Backend

from .conftest import S3Server

pytestmark = pytest.mark.integration

RACES = 15


@pytest.mark.promise("s3-sink-owner", "backend")
def test_two_claims_at_once_never_both_win(s3_server: S3Server, prefix: str) -> None:
    backends = [S3Backend.from_options(s3_server.options(prefix)) for _ in range(2)]
    try:
        for b in backends:  # connect first, so the race is about the claim itself
            b.client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix, MaxKeys=1)
        for race in range(RACES):
            sink_id = f"race-{race}"
            barrier = threading.Barrier(2)
            outcome: dict[int, str] = {}

            def claim(i: int, sink_id: str = sink_id,
                      barrier: threading.Barrier = barrier,
                      outcome: dict[int, str] = outcome) -> None:
                barrier.wait()
                try:
                    backends[i].claim_sink(sink_id, f"state-{i}", f"s3://chk/{i}/txsink")
                    outcome[i] = "won"
                except ConfigError as exc:
                    outcome[i] = "refused: " + str(exc)

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            winners = [i for i, o in outcome.items() if o == "won"]
            assert len(winners) == 1, f"race {race}: {outcome}"
            loser = 1 - winners[0]
            assert f"s3://chk/{winners[0]}/txsink" in outcome[loser]
            # The winner keeps its claim; the loser stays refused.
            backends[winners[0]].claim_sink(sink_id, f"state-{winners[0]}", "again")
            with pytest.raises(ConfigError, match="two queries must not share a sink id"):
                backends[loser].claim_sink(sink_id, f"state-{loser}", "again")
    finally:
        for b in backends:
            b.close()


def test_an_unreadable_owner_object_is_refused(s3_server: S3Server, prefix: str) -> None:
    backend = S3Backend.from_options(s3_server.options(prefix))
    try:
        key = f"{backend.base('s1')}/_txsink/owner.json"
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=b"")
        with pytest.raises(ConfigError, match="delete it") as info:
            backend.claim_sink("s1", uuid.uuid4().hex, "s3://chk/txsink")
        assert info.value.field == "sink_id"
    finally:
        backend.close()


def _drop_conditions(request: Any, **_: Any) -> None:
    """What a server (or gateway) that ignores conditional PUTs does with them."""
    for header in ("If-Match", "If-None-Match"):
        if header in request.headers:
            del request.headers[header]


@pytest.mark.promise("s3-claim-without-conditional-writes", "backend")
def test_a_server_ignoring_if_none_match_cannot_give_one_sink_id_to_two_queries(
        s3_server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Operations hole 5: on such a server the create-only PUT of the owner object
    overwrote another query's claim, and both queries then aborted each other's
    uploads as "restored from an older backup"."""
    monkeypatch.setattr(s3backend, "_conditional", {}, raising=False)
    first = S3Backend.from_options(s3_server.options(prefix))
    second = S3Backend.from_options(s3_server.options(prefix))
    try:
        for b in (first, second):
            b.client.meta.events.register("before-sign.s3.PutObject", _drop_conditions)
        first.claim_sink("shared", "state-1", "s3://chk/1/txsink")
        with pytest.raises(SinkOwnedError, match="two queries must not share a sink id"):
            second.claim_sink("shared", "state-2", "s3://chk/2/txsink")
        first.claim_sink("shared", "state-1", "again")  # the first keeps its claim
        owner = json.loads(s3_server.client().get_object(
            Bucket=s3_server.bucket,
            Key=f"{first.base('shared')}/_txsink/owner.json")["Body"].read())
        assert owner["state_id"] == "state-1"
        warnings = [r for r in caplog.records if "does not honour conditional writes" in
                    r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelname == "WARNING"  # once per endpoint
    finally:
        first.close()
        second.close()
    # The probe left nothing behind.
    assert not [k for k in s3_server.keys(f"{prefix}/") if "/probe-" in k]


def test_an_s3_target_of_another_query_leaves_the_files_target_unclaimed(
        s3_server: S3Server, prefix: str, tmp_path: Path) -> None:
    """The files target comes first: before the group checked every claim, it was
    claimed and kept bound to a state the refused run then deleted. The S3 check is a
    GET of the owner object: it writes none."""
    items = [{"name": "files", "backend": "files", "options": {"path": str(tmp_path / "out")}},
             {"name": "copy", "backend": "s3", "options": s3_server.options(prefix)}]
    group = TargetGroup.from_specs("g", parse_targets(items, "g"))
    copy = group.members["copy"].backend
    assert isinstance(copy, S3Backend)

    def keys() -> list[str]:
        return sorted(s3_server.keys(prefix))

    try:
        copy.check_claim("g--copy", "state-new", "s3://chk/new/txsink")
        assert not [k for k in keys() if k.endswith("owner.json")]
        copy.claim_sink("g--copy", "state-old", "s3://chk/old/txsink")  # another query's
        before = keys()
        with pytest.raises(SinkOwnedError, match="two queries must not share a sink id") as info:
            group.claim_sink("g", "state-new", "s3://chk/new/txsink")
        assert info.value.owner_state == "s3://chk/old/txsink"
        assert not (tmp_path / "out" / "_txsink" / "state.json").exists()
        assert keys() == before
        # The way out the refusal names, followed literally: delete that owner object.
        named = re.search(r"delete the owner object s3://([^/]+)/(\S+) if", str(info.value))
        assert named, str(info.value)
        copy.client.delete_object(Bucket=named.group(1), Key=named.group(2))
        group.claim_sink("g", "state-new", "s3://chk/new/txsink")
        owner = copy.client.get_object(Bucket=named.group(1), Key=named.group(2))
        assert json.loads(owner["Body"].read())["state_id"] == "state-new"
        assert "state-new" in (tmp_path / "out" / "_txsink" / "state.json").read_text()
    finally:
        group.close()
