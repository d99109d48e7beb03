"""The pure parts of the cluster backend: seed URLs, node URLs, ``CLUSTER SLOTS`` and
``MOVED``/``ASK`` replies (no I/O; ``_cluster.py`` uses them)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from ._backend import RedisAddress, redact_url
from ._errors import CommandError
from ._slots import arg_bytes, command_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._backend import Wire

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_seeds(url_or_seeds: str | Sequence[str]) -> tuple[RedisAddress, ...]:
    """Parse seed nodes: ``redis+cluster://[user:pw@]h1:p1,h2:p2`` (or ``rediss+cluster``),
    one ``redis://``/``rediss://`` URL, or a sequence of them.

    Raises:
        ValueError: no seed, a unix socket, or a database other than 0 (a cluster has one).
    """
    if isinstance(url_or_seeds, str):
        parts = urlsplit(url_or_seeds)
        base = CLUSTER_SCHEMES.get(parts.scheme)
        if base is None:
            urls = [url_or_seeds]
        else:
            userinfo, at, hosts = parts.netloc.rpartition("@")
            urls = [urlunsplit((base, f"{userinfo}{at}{h}", parts.path, parts.query, ""))
                    for h in hosts.split(",") if h]
    else:
        urls = list(url_or_seeds)
    seeds = tuple(RedisAddress.from_url(u) for u in urls)
    if not seeds:
        raise ValueError("a Redis Cluster needs at least one seed node")
    for url, seed in zip(urls, seeds, strict=True):
        if seed.unix_path is not None:
            raise ValueError(f"a cluster node needs host:port, not a socket: {redact_url(url)}")
        if seed.db:
            raise ValueError(f"a Redis Cluster has only database 0: {redact_url(url)}")
    return seeds


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def node_url(template: RedisAddress, address: str) -> str:
    """A node's URL, with the seeds' scheme, TLS options and credentials."""
    return template.url_for(*split_address(address), db=0)


#: How many distinct scripts a cluster backend remembers for new primaries.
MAX_REMEMBERED_SCRIPTS = 256


def is_script_load(wire: Wire) -> bool:
    return (len(wire) == 3 and command_name(wire) == "SCRIPT"
            and arg_bytes(wire[1]).upper() == b"LOAD")


def redirect_of(reply: object, replied_by: str) -> tuple[bool, int, str] | None:
    """``(ask, slot, address)`` of a ``MOVED``/``ASK`` error reply, else None."""
    if not isinstance(reply, CommandError):
        return None
    kind, _, rest = reply.reply.partition(" ")
    if kind not in ("MOVED", "ASK"):
        return None
    slot, _, endpoint = rest.partition(" ")
    host, _, port = endpoint.rpartition(":")
    if not slot.isdigit() or not port.isdigit():
        return None
    # An empty host means "the host you asked" (cluster-preferred-endpoint-type unknown).
    host = host or split_address(replied_by)[0]
    return kind == "ASK", int(slot), f"{host}:{port}"


def parse_slots(reply: object, asked: str) -> list[tuple[int, int, str]]:
    """``CLUSTER SLOTS`` → ``[(first, last, primary address), ...]``.

    Raises:
        ValueError: the reply is not a slot table.
    """
    if not isinstance(reply, list) or not reply:
        raise ValueError(f"not a slot table: {reply!r:.200}")
    ranges = []
    for entry in reply:
        first, last, primary = entry[0], entry[1], entry[2]
        raw_host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        host = split_address(asked)[0] if raw_host in ("", "?") else raw_host
        ranges.append((int(first), int(last), f"{host}:{int(primary[1])}"))
    return ranges
