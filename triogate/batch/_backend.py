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

import ssl
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

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


#: ``ssl_cert_reqs`` values (redis-py's spellings) and what they ask of the server.
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
              "required": ssl.CERT_REQUIRED}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
#: The URL query parameters that configure TLS (``rediss://`` only).
TLS_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                  "ssl_check_hostname")


@attrs.frozen(kw_only=True)
class TlsOptions:
    """How a ``rediss://`` connection checks the server and shows itself, from the URL's
    query parameters (redis-py's and LiteLLM's spellings):

    ``ssl_ca_certs``
        A PEM file of the certificate authorities to trust (a private CA); default: the
        system's.
    ``ssl_certfile``, ``ssl_keyfile``
        A client certificate and its key (PEM), for servers with ``tls-auth-clients``.
    ``ssl_cert_reqs``
        ``required`` (the default), ``optional`` or ``none`` (no check at all: the link is
        encrypted but anyone can stand in for the server).
    ``ssl_check_hostname``
        ``true`` (the default unless ``ssl_cert_reqs=none``) or ``false``.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_reqs: str = "required"
    check_hostname: bool | None = None

    @classmethod
    def from_query(cls, query: dict[str, str]) -> TlsOptions:
        """Read the ``ssl_*`` parameters of ``query``.

        Raises:
            ValueError: a value is not understood, or a key file without a certificate.
        """
        reqs = query.get("ssl_cert_reqs", "required").lower()
        if reqs not in _CERT_REQS:
            raise ValueError(f"ssl_cert_reqs must be none, optional or required, not {reqs!r}")
        check: bool | None = None
        if "ssl_check_hostname" in query:
            text = query["ssl_check_hostname"].lower()
            if text not in _TRUE + _FALSE:
                raise ValueError(f"ssl_check_hostname must be true or false, not {text!r}")
            check = text in _TRUE
        options = cls(ca_file=query.get("ssl_ca_certs") or None,
                      cert_file=query.get("ssl_certfile") or None,
                      key_file=query.get("ssl_keyfile") or None,
                      cert_reqs=reqs, check_hostname=check)
        if options.key_file and not options.cert_file:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        if options.check_hostname and reqs == "none":
            raise ValueError("ssl_check_hostname=true needs ssl_cert_reqs other than none")
        return options

    def query(self) -> dict[str, str]:
        """The query parameters that give these options back (defaults left out)."""
        out = {"ssl_ca_certs": self.ca_file, "ssl_certfile": self.cert_file,
               "ssl_keyfile": self.key_file}
        params = {k: v for k, v in out.items() if v}
        if self.cert_reqs != "required":
            params["ssl_cert_reqs"] = self.cert_reqs
        if self.check_hostname is not None:
            params["ssl_check_hostname"] = "true" if self.check_hostname else "false"
        return params

    def context(self) -> ssl.SSLContext:
        """A client SSL context for these options. Reads the certificate files: call it
        from a worker thread (:class:`~._resp.TlsContext` does).

        Raises:
            OSError, ssl.SSLError: a file is missing or not PEM.
        """
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_reqs == "none":
            context.check_hostname = False
        elif self.check_hostname is not None:
            context.check_hostname = self.check_hostname
        context.verify_mode = _CERT_REQS[self.cert_reqs]
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@attrs.frozen(kw_only=True)
class RedisAddress:
    """Where a Redis-compatible server listens, parsed from a URL.

    Accepted: ``redis://[user:password@]host[:port][/db]``, ``rediss://…`` (TLS, with the
    ``ssl_*`` query parameters of :class:`TlsOptions`) and
    ``unix:///path/to/socket[?db=N&password=…]``. The user and password (or a
    ``password`` query parameter) authenticate with ``AUTH`` (an ACL user, or the default
    user's ``requirepass``).
    """

    host: str | None = None
    port: int = 6379
    unix_path: str | None = None
    tls: bool = False
    tls_options: TlsOptions = attrs.field(factory=TlsOptions)
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
        tls = parts.scheme == "rediss"
        stray = [p for p in TLS_PARAMETERS if p in query]
        if stray and not tls:
            raise ValueError(f"{', '.join(stray)}: TLS parameters need a rediss:// URL, "
                             f"not {parts.scheme}://")
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
            tls=tls,
            tls_options=TlsOptions.from_query(query) if tls else TlsOptions(),
            username=username,
            password=password,
            db=int(path or query.get("db", "0")),
        )

    def url_for(self, host: str, port: int, *, db: int | None = None) -> str:
        """The URL of the server at ``host:port`` reached as this one is (scheme, TLS
        options, user and password): how a cluster's or a sentinel's other nodes are
        reached."""
        auth = ""
        if self.password is not None:
            user = quote(self.username, safe="") if self.username else ""
            auth = f"{user}:{quote(self.password, safe='')}@"
        elif self.username:
            auth = f"{quote(self.username, safe='')}@"
        where = f"[{host}]" if ":" in host else host
        query = urlencode(self.tls_options.query()) if self.tls else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}{where}:{port}/{self.db if db is None else db}" + (
            f"?{query}" if query else "")


def redact_url(url: str) -> str:
    """``url`` with any password (in the user part, or a ``password``/
    ``sentinel_password`` query parameter) replaced by ``***``, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        parts = parts._replace(netloc=netloc)
    if parts.query and "password" in parts.query:
        pairs = [(k, "***" if k.endswith("password") else v)
                 for k, values in parse_qs(parts.query, keep_blank_values=True).items()
                 for v in values]
        parts = parts._replace(query=urlencode(pairs, safe="*/"))
    return parts.geturl()
