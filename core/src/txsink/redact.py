"""Scrub secret values out of text before it reaches a log line or an exception."""

from __future__ import annotations

import re
from collections.abc import Iterable

_URL_PASSWORD = re.compile(r"(?P<pre>[a-z][a-z0-9+.-]*://[^:/@\s]+:)(?P<pw>[^@\s]+)(?P<post>@)",
                           re.IGNORECASE)
#: ``key=value`` pairs whose value is a secret: libpq's ``password``/``sslpassword``
#: (also as ``connect.sslpassword``), SASL passwords, AWS secret keys and session tokens.
_KV_PASSWORD = re.compile(
    r"(?P<pre>\b(?:[a-z0-9_.]*password|passwd|secret|[a-z0-9_.]*secret_access_key"
    r"|[a-z0-9_.]*session_token)\s*[=:]\s*)"
    r"(?P<pw>'[^']*'|\"[^\"]*\"|\S+)", re.IGNORECASE)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace known secret values, URL passwords and ``password=...`` pairs with ``***``."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_PASSWORD.sub(r"\g<pre>***\g<post>", text)
    return _KV_PASSWORD.sub(r"\g<pre>***", text)
