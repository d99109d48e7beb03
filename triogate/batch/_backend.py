"""The backend seam: something that sends one pipeline and returns one reply per command.

A flush hands each backend the commands of one round as a single pipeline. The backend
returns, in order, either the reply or an error *instance* per command (never raising
for one command's error), and raises :class:`BackendUnavailable` only when the pipeline
failed as a whole. Every backend bounds its own wait (``command_timeout_s``): a dead or
paused server costs a timeout, never a hang.

:class:`RespBackend` (``_resp.py``) is our pipelined RESP2 client on Trio sockets and
hiredis. Tests use the fakes in :mod:`triogate.batch.testing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import attrs

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._command import Arg

#: A command as sent on the wire: ``("GET", "k")``, ``("EVALSHA", sha, 1, "k", 5)``.
Wire = tuple["Arg", ...]


class Backend(Protocol):
    """Sends pipelines to one Redis-compatible deployment (a server, or a whole cluster).

    A backend may also have a ``script_fuser`` attribute (a :class:`~._fusion.Fuser`, or
    None): the flush then sends the script calls of a pipeline fused, as that fuser says
    (all at once on a server, per hash slot on a cluster). Without one, every script
    call is its own ``EVALSHA``. It is optional so that any object with ``name`` and
    ``execute`` stays a backend (test fakes opt out by not having it).
    """

    @property
    def name(self) -> str:
        """Short label used in traces, errors and metrics."""
        ...

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        """Send ``commands`` as one pipeline (per cluster node) and return their replies.

        Returns:
            One entry per command, in order: the decoded reply (bytes, int, None, list) or
            an exception instance: :class:`CommandError` for an error reply, or
            :class:`BackendUnavailable` for the commands of one unreachable cluster node.

        Raises:
            BackendUnavailable: the pipeline failed as a whole (refused, reset, timed out).

        This is a checkpoint. Cancelling it mid-flight drops the connection it used.
        """
        ...


@attrs.frozen(kw_only=True)
class RedisAddress:
    """Where a Redis-compatible server listens, parsed from a URL.

    Accepted: ``redis://[user:password@]host[:port][/db]``, ``rediss://…`` (TLS) and
    ``unix:///path/to/socket[?db=N&password=…]``.
    """

    host: str | None = None
    port: int = 6379
    unix_path: str | None = None
    tls: bool = False
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    db: int = 0

    @classmethod
    def from_url(cls, url: str) -> RedisAddress:
        """Parse a redis://, rediss:// or unix:// URL.

        Raises:
            ValueError: the scheme or a part of the URL is not understood.
        """
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        password = unquote(parts.password) if parts.password else query.get("password")
        username = unquote(parts.username) if parts.username else None
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError(f"unix URL without a socket path: {redact_url(url)}")
            return cls(
                unix_path=parts.path,
                username=username,
                password=password,
                db=int(query.get("db", "0")),
            )
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(
                f"unsupported Redis URL scheme {parts.scheme!r} (redis://, rediss://, unix://)"
            )
        path = parts.path.strip("/")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            tls=parts.scheme == "rediss",
            username=username,
            password=password,
            db=int(path or query.get("db", "0")),
        )


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
