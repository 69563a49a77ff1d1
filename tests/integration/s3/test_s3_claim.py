"""Sink-id ownership on S3: of two queries claiming one sink id at once, exactly one wins."""

from __future__ import annotations

import threading
import uuid

import pytest
from txsink.errors import ConfigError
from txsink_s3.backend import S3Backend

from .conftest import S3Server

pytestmark = pytest.mark.integration

RACES = 15


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
