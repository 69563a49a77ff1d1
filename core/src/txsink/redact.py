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


#: Words, as the secrets check of committables compares them (see :func:`leaked_secret`):
#: identifiers (``t_orders``) and their parts (``orders``).
_WORDS = (re.compile(r"[A-Za-z0-9_]+"), re.compile(r"[A-Za-z0-9]+"))
#: Words every committable may carry (names txsink itself gives).
_OWN_WORDS = frozenset({"txsink"})


def leaked_secret(data: object, secrets: Iterable[str], public: Iterable[str]) -> str | None:
    """The first of ``secrets`` that a committable's ``data`` (its decoded JSON) carries.

    Only the committable's string values are searched. An occurrence that lies inside
    one word of ``public`` (the backend's name and description, the sink id, the
    participant's name: what the state shows anyway) is that word, not the secret: a
    password that equals ``postgres`` or a table's name, or is part of one, no longer
    refuses every epoch of its sink. Any other occurrence is a leak: the secret across
    word boundaries (a DSN ``user:pw@host``), or inside a word nothing public explains.
    """
    words = _OWN_WORDS | {w for p in public for pattern in _WORDS for w in pattern.findall(p)}
    wanted = [s for s in secrets if s]

    def leaks(value: str, secret: str) -> bool:
        spans = [(m.start(), m.end()) for pattern in _WORDS for m in pattern.finditer(value)
                 if m.group(0) in words]
        start = value.find(secret)
        while start >= 0:
            end = start + len(secret)
            if not any(a <= start and end <= b for a, b in spans):
                return True
            start = value.find(secret, start + 1)
        return False

    def found(value: object) -> str | None:
        if isinstance(value, str):
            return next((s for s in wanted if leaks(value, s)), None)
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple)):
            return next((hit for v in value if (hit := found(v)) is not None), None)
        return None

    return found(data)
