"""The model-based test of operations (:mod:`tests.operations_model`) on the S3 state
store, against the real SeaweedFS of the session: the same rules, plus a state put on
an endpoint that ignores conditional writes. Fewer sequences than the directory run
(every step is S3 requests); ``tox -e operations-long`` runs more."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import rule
from txsink.errors import ConfigError
from txsink_s3 import state as s3state
from txsink_s3.state import S3StateStore

from tests.operations_model import EXAMPLES_ENV, FIRED, OperationsModel, settings_for

from .conftest import S3Server

pytestmark = pytest.mark.integration

_server: S3Server | None = None


def _drop_conditions(request: Any, **_: Any) -> None:
    for header in ("If-Match", "If-None-Match"):
        if header in request.headers:
            del request.headers[header]


class S3Operations(OperationsModel):
    def new_location(self) -> str:
        assert _server is not None
        self.server = _server
        self.client = _server.client()
        self.prefix = f"ops-{uuid.uuid4().hex[:12]}"
        return f"s3://{_server.bucket}/{self.prefix}/state"

    def open_store(self, location: str) -> S3StateStore:
        return S3StateStore(location, client=self.client)

    def _keys(self, prefix: str) -> list[str]:
        return self.server.keys(prefix)

    def copy_state(self) -> str:
        copy = f"{self.prefix}/copy-{uuid.uuid4().hex[:8]}/"
        for key in self._keys(f"{self.prefix}/state/"):
            self.client.copy_object(Bucket=self.server.bucket, Key=copy + key.split(
                "/state/", 1)[1], CopySource={"Bucket": self.server.bucket, "Key": key})
        return copy

    def put_state_back(self, copy: str) -> None:
        for key in self._keys(f"{self.prefix}/state/"):
            self.client.delete_object(Bucket=self.server.bucket, Key=key)
        for key in self._keys(copy):
            self.client.copy_object(Bucket=self.server.bucket,
                                    Key=f"{self.prefix}/state/{key[len(copy):]}",
                                    CopySource={"Bucket": self.server.bucket, "Key": key})

    def cleanup(self) -> None:
        for key in self._keys(f"{self.prefix}/"):
            self.client.delete_object(Bucket=self.server.bucket, Key=key)

    @rule()
    def state_on_a_store_ignoring_conditional_writes(self) -> None:
        """Refused before anything is written: two drivers could both write there."""
        FIRED["loud: no conditional writes"] += 1
        client = self.server.client()
        client.meta.events.register("before-sign.s3.PutObject", _drop_conditions)
        saved = set(s3state._probed)
        s3state._probed.clear()
        prefix = f"{self.prefix}/elsewhere-{uuid.uuid4().hex[:8]}"
        try:
            store = S3StateStore(f"s3://{self.server.bucket}/{prefix}", client=client)
            with pytest.raises(ConfigError, match="does not honour conditional writes"):
                store.acquire(self.owner)
        finally:
            s3state._probed.clear()
            s3state._probed.update(saved)
        assert self._keys(f"{prefix}/") == []


def test_operations_on_the_s3_state_store(s3_server: S3Server) -> None:
    global _server
    _server = s3_server
    try:
        test = S3Operations.TestCase
        # Every step is S3 requests: a fiftieth of a long run's sequences, 25 by default.
        wanted = settings_for(25)
        if os.environ.get(EXAMPLES_ENV):
            wanted["max_examples"] = max(25, wanted["max_examples"] // 50)
        test.settings = settings(**{**wanted, "stateful_step_count": 15})
        test("runTest").runTest()
    finally:
        _server = None
