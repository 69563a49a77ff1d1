"""The secrets check of committables: a secret in a committable is refused, a password
that merely equals a public word of the target (its backend, table, sink id) is not.

Before, any occurrence as a substring refused the epoch: a PostgreSQL password
``postgres`` (the backend's name is in every committable) or one equal to the table's
name refused every epoch of the sink, for ever.
"""

from __future__ import annotations

import pytest
from txsink.redact import leaked_secret

PUBLIC = ("postgres", "postgres 127.0.0.1:5432/postgres table public.t_orders",
          "shop--totals", "shop--totals-e41-p0-a7", "totals")
COMMITTABLE = {"backend": "postgres", "sink_id": "shop--totals", "target": "totals",
               "participant": "shop--totals-e41-p0-a7", "epoch": 41,
               "payload": {"gid": "txsink_shop__totals_e41_p0_a7", "xid": 77,
                           "table": "public.t_orders"}}


@pytest.mark.parametrize("password", ["postgres", "t_orders", "orders", "post", "shop",
                                      "totals", "txsink"])
def test_a_password_equal_to_or_inside_a_public_word_is_no_leak(password: str) -> None:
    assert leaked_secret(COMMITTABLE, [password], PUBLIC) is None


@pytest.mark.parametrize(("value", "password"), [
    ("postgresql://loader:s3cr3t@db/shop", "s3cr3t"),
    ("host=db password=postgres!", "postgres!"),      # across a word boundary
    ("loader:orders@db", "rders@d"),                   # crosses words
    ("token-Xk29aQ", "Xk29aQ"),                        # a word nothing public explains
    ("abcXk29aQdef", "Xk29aQ"),                        # inside an unknown word
])
def test_a_secret_written_into_a_value_is_found(value: str, password: str) -> None:
    data = {**COMMITTABLE, "payload": {**COMMITTABLE["payload"], "note": [value]}}
    assert leaked_secret(data, [password], PUBLIC) == password


def test_only_string_values_are_searched() -> None:
    assert leaked_secret({"payload": {"xid": 4242}}, ["4242"], ()) is None
    assert leaked_secret({"password_key": "x"}, ["password_key"], ()) is None
