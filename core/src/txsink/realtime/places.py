"""One server under two names: the normalisation every "same place" check shares.

A PostgreSQL DSN with ``host=localhost`` and one with ``host=127.0.0.1`` reach one
server; so do Kafka bootstrap lists that name the same broker in another order or
under another alias. Two real-time targets writing one table or topic through two such
names would each add every record there, and a Kafka target writing the topic the
query reads through another alias would feed it without end. So endpoints are
compared by the addresses their host names resolve to (a name that does not resolve
stands for itself, lower-cased), and two lists are one cluster when they share an
endpoint: a bootstrap list in another order is the same list.
"""

from __future__ import annotations

import concurrent.futures
import functools
import socket
from collections.abc import Iterable

#: How long one host name may take to resolve before it stands for itself.
RESOLVE_TIMEOUT_S = 2.0
_RESOLVER = concurrent.futures.ThreadPoolExecutor(max_workers=2,
                                                  thread_name_prefix="txsink-resolve")


@functools.lru_cache(maxsize=256)
def host_addresses(host: str) -> frozenset[str]:
    """The addresses ``host`` resolves to, with the name itself (lower-cased) among them
    (an unknown or slow name is compared as written). Unix socket directories (a
    PostgreSQL ``host`` starting with ``/``) and the empty host stand for themselves."""
    name = host.strip().strip("[]").lower()
    if not name or name.startswith("/"):
        return frozenset({name})
    try:
        infos = _RESOLVER.submit(socket.getaddrinfo, name, None).result(RESOLVE_TIMEOUT_S)
    except Exception:
        return frozenset({name})
    return frozenset({name, *(str(info[4][0]) for info in infos)})


def endpoints(servers: str, default_port: str = "") -> list[tuple[str, str]]:
    """``host:port`` pairs of a comma-separated list (``[::1]:9092`` too)."""
    out: list[tuple[str, str]] = []
    for item in servers.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.lstrip(":") or default_port
        elif item.count(":") == 1:
            host, port = item.split(":")
        else:
            host, port = item, default_port
        out.append((host, port.strip()))
    return out


def same_endpoint(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """One port, and host names that share an address."""
    return a[1] == b[1] and bool(host_addresses(a[0]) & host_addresses(b[0]))


def share_endpoint(first: Iterable[tuple[str, str]], second: Iterable[tuple[str, str]]) -> bool:
    """Whether two lists of endpoints name one server between them (order, case and
    aliases aside): a Kafka cluster reached through either list is one cluster."""
    others = list(second)
    return any(same_endpoint(a, b) for a in first for b in others)


__all__ = ["endpoints", "host_addresses", "same_endpoint", "share_endpoint"]
