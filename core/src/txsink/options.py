"""Typed, eagerly validated access to string options (Spark hands every option as a string).

Backends parse their options through :class:`Options` so that every problem is
reported the same way: the option's name, what was given, what is allowed. Values
of options a backend declares secret are never echoed.
"""

from __future__ import annotations

import builtins
import difflib
from collections.abc import Iterable, Mapping
from typing import TypeVar

from txsink.errors import ConfigError

T = TypeVar("T")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class Secret:
    """A string that prints as ``***`` so it cannot leak into logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class Options:
    """Read-once view of a backend's options.

    Every read marks the key as known; :meth:`check_unknown` then rejects typos,
    which is what users of Spark's silently-ignored options need most.
    """

    def __init__(
        self,
        raw: Mapping[builtins.str, object],
        *,
        owner: builtins.str,
        secret_keys: Iterable[builtins.str] = (),
        prefix: builtins.str = "",
    ) -> None:
        self._raw = {str(k): v for k, v in raw.items()}
        self._owner = owner
        self._prefix = prefix
        self._known: set[builtins.str] = set()
        self._secret_keys = set(secret_keys)

    def _field(self, key: builtins.str) -> builtins.str:
        return f"{self._prefix}{key}"

    def _shown(self, key: builtins.str, value: object) -> builtins.str:
        return "'***'" if key in self._secret_keys else repr(value)

    def has(self, key: builtins.str) -> builtins.bool:
        self._known.add(key)
        return key in self._raw and self._raw[key] not in (None, "")

    def str(
        self,
        key: builtins.str,
        default: builtins.str | None = None,
        *,
        required: builtins.bool = False,
    ) -> builtins.str:
        self._known.add(key)
        value = self._raw.get(key)
        if value is None or value == "":
            if required or default is None:
                # A typo of this very option is the likeliest reason it is missing.
                close = difflib.get_close_matches(
                    key, [k for k in self._raw if k not in self._known and k != key], n=1)
                hint = (f" ('{self._field(close[0])}' is given: did you mean "
                        f"'{self._field(key)}'?)" if close else "")
                raise ConfigError(
                    f"{self._owner}: option '{self._field(key)}' is required{hint}",
                    field=self._field(key),
                )
            return default
        return str(value)

    def optional(self, key: builtins.str) -> builtins.str | None:
        self._known.add(key)
        value = self._raw.get(key)
        return None if value is None or value == "" else str(value)

    def secret(self, key: builtins.str) -> Secret | None:
        self._secret_keys.add(key)
        value = self.optional(key)
        return None if value is None else Secret(value)

    def int(
        self,
        key: builtins.str,
        default: builtins.int,
        *,
        minimum: builtins.int | None = None,
        maximum: builtins.int | None = None,
    ) -> builtins.int:
        self._known.add(key)
        value = self._raw.get(key)
        if value is None or value == "":
            return default
        try:
            if isinstance(value, bool):
                raise ValueError
            number = int(str(value).replace("_", "")) if not isinstance(value, int) else value
        except ValueError:
            raise ConfigError(
                f"{self._owner}: option '{self._field(key)}' must be an integer, "
                f"got {self._shown(key, value)}",
                field=self._field(key),
            ) from None
        if minimum is not None and number < minimum:
            raise ConfigError(
                f"{self._owner}: option '{self._field(key)}' must be at least {minimum}, "
                f"got {number}",
                field=self._field(key),
            )
        if maximum is not None and number > maximum:
            raise ConfigError(
                f"{self._owner}: option '{self._field(key)}' must be at most {maximum}, "
                f"got {number}",
                field=self._field(key),
            )
        return number

    def float(
        self, key: builtins.str, default: builtins.float, *, minimum: builtins.float | None = None
    ) -> builtins.float:
        self._known.add(key)
        value = self._raw.get(key)
        if value is None or value == "":
            return default
        try:
            number = float(str(value))
        except ValueError:
            raise ConfigError(
                f"{self._owner}: option '{self._field(key)}' must be a number, "
                f"got {self._shown(key, value)}",
                field=self._field(key),
            ) from None
        if minimum is not None and number < minimum:
            raise ConfigError(
                f"{self._owner}: option '{self._field(key)}' must be at least {minimum}, "
                f"got {number}",
                field=self._field(key),
            )
        return number

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        self._known.add(key)
        value = self._raw.get(key)
        if value is None or value == "":
            return default
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(
            f"{self._owner}: option '{self._field(key)}' must be true or false, "
            f"got {self._shown(key, value)}",
            field=self._field(key),
        )

    def choice(
        self, key: builtins.str, allowed: Iterable[builtins.str], default: builtins.str
    ) -> builtins.str:
        allowed = list(allowed)
        value = self.str(key, default).strip().lower()
        if value not in allowed:
            raise ConfigError(
                f"{self._owner}: option '{self._field(key)}' must be one of "
                f"{', '.join(allowed)}; got {value!r}",
                field=self._field(key),
            )
        return value

    def with_prefix(self, prefix: builtins.str) -> dict[builtins.str, builtins.str]:
        """All options starting with ``prefix``, prefix stripped (e.g. Spark's ``kafka.*``)."""
        out: dict[builtins.str, builtins.str] = {}
        for key, value in self._raw.items():
            if key.startswith(prefix):
                self._known.add(key)
                out[key[len(prefix) :]] = str(value)
        return out

    def ignore(self, *keys: builtins.str) -> None:
        """Mark keys as known without reading them (they belong to another layer)."""
        self._known.update(keys)

    def check_unknown(self) -> None:
        unknown = sorted(set(self._raw) - self._known)
        if unknown:
            known = ", ".join(sorted(self._known)) or "(none)"
            close = difflib.get_close_matches(unknown[0], sorted(self._known), n=1)
            hint = f" (did you mean '{self._field(close[0])}'?)" if close else ""
            raise ConfigError(
                f"{self._owner}: unknown option(s) {', '.join(map(repr, unknown))}{hint}; "
                f"known options: {known}",
                field=self._field(unknown[0]),
            )
