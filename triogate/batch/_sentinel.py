"""A Redis primary found through Redis Sentinel, followed across failovers.

``redis+sentinel://[user:password@]host:port[,host:port...]/service_name`` names the
sentinels and the service (the ``sentinel monitor`` name); ``rediss+sentinel://`` reaches
the sentinels and the primary over TLS, with the ``ssl_*`` query parameters of
:class:`~._backend.TlsOptions` (``ssl_ca_certs`` for a private CA). ``?sentinel_password=…``
(and ``sentinel_username``) authenticate to the sentinels when they need it; the URL's
own user and password are the primary's.

:class:`SentinelBackend` asks the sentinels, in order, for the primary's address, checks
with ``ROLE`` that the server there is a primary, and sends every pipeline to it through a
:class:`~._resp.RespBackend`. It asks again:

- when a pipeline fails as a whole (the primary died or is unreachable),
- when a reply says the server is no longer a writable primary (``READONLY``: a demoted
  primary that came back as a replica; ``MASTERDOWN``),
- when a sentinel announces ``+switch-master`` for the service (:meth:`watch`, a task the
  owner runs).

A failed pipeline is never re-sent: the server may have executed it. Its owners see
:class:`BackendUnavailable`, as for any lost connection, and the settler's journal
replays the writes, idempotently, once the new primary answers.

Replication is asynchronous: in a failover, what the old primary acknowledged but had
not passed on is lost with it, and so is what it took between the replica's promotion and
its own demotion (about a second, until the sentinel reconfigures it). ``wait_replicas``
closes that window: each pipeline ends with ``WAIT n``, and a pipeline whose writes fewer
than ``n`` replicas acknowledged within half the command timeout counts as failed, so
the settler journals it and replays it to whichever primary comes next. The cost is one
replication round trip per pipeline while the replicas keep up.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, final
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import attrs
import trio

from ._backend import TLS_PARAMETERS, TlsOptions
from ._errors import BackendUnavailable, CommandError
from ._fusion import Fuser
from ._resp import BackendStatistics, RespBackend, TlsContext

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from ._backend import Wire
    from ._resp import Subscription

logger = logging.getLogger("triogate.batch.sentinel")

SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Error replies that mean "this server is not the writable primary any more".
_NOT_PRIMARY = ("READONLY", "MASTERDOWN")
#: Pause before watching another sentinel after one was lost.
_WATCH_RETRY_S = 1.0


@attrs.frozen(kw_only=True)
class SentinelAddress:
    """The sentinels, the service they monitor, and how to reach its primary."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    tls: bool = False
    tls_options: TlsOptions = attrs.field(factory=TlsOptions)
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    db: int = 0
    sentinel_username: str | None = None
    sentinel_password: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_url(cls, url: str) -> SentinelAddress:
        """Parse a ``redis+sentinel://`` URL.

        Raises:
            ValueError: not a sentinel URL, no sentinel, no service name, or TLS
                parameters that are not understood (or without ``rediss+sentinel://``).
        """
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"not a sentinel URL (redis+sentinel://): {parts.scheme}://")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        hosts = parts.netloc.rpartition("@")[2]
        sentinels = tuple(_host_port(h) for h in hosts.split(",") if h)
        path = [p for p in parts.path.split("/") if p]
        if not sentinels:
            raise ValueError("a sentinel URL names at least one sentinel host:port")
        if not path:
            raise ValueError("a sentinel URL names the service: redis+sentinel://host:port/NAME")
        tls = parts.scheme == "rediss+sentinel"
        stray = [p for p in TLS_PARAMETERS if p in query]
        if stray and not tls:
            raise ValueError(f"{', '.join(stray)}: TLS parameters need rediss+sentinel://")
        return cls(
            sentinels=sentinels,
            service=unquote(path[0]),
            tls=tls,
            tls_options=TlsOptions.from_query(query) if tls else TlsOptions(),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else query.get("password"),
            db=int(path[1]) if len(path) > 1 else int(query.get("db", "0")),
            sentinel_username=query.get("sentinel_username"),
            sentinel_password=query.get("sentinel_password"),
        )

    def primary_url(self, host: str, port: int) -> str:
        """The URL of the primary at ``host:port`` with this address's credentials."""
        return self._url(host, port, self.username, self.password, self.db)

    def sentinel_url(self, host: str, port: int) -> str:
        """The URL of the sentinel at ``host:port`` with the sentinels' credentials."""
        return self._url(host, port, self.sentinel_username, self.sentinel_password, 0)

    def _url(self, host: str, port: int, username: str | None, password: str | None,
             db: int) -> str:
        auth = ""
        if password is not None:
            auth = f"{_quote(username) if username else ''}:{_quote(password)}@"
        query = urlencode(self.tls_options.query()) if self.tls else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}{host}:{port}/{db}" + (f"?{query}" if query else "")


@final
class SentinelBackend:
    """The primary of a Sentinel-managed service, re-discovered after a failover.

    Args:
        url: ``redis+sentinel://…`` (see the module docstring).
        name: label for traces and errors.
        pool_size, command_timeout_s: as :class:`RespBackend`'s, for the primary.
        min_discover_interval_s: least time between two discoveries while every one
            fails (a dead primary costs one sentinel round per interval, not per pipeline).
        wait_replicas: replicas that must acknowledge each pipeline (module docstring).
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "redis",
        pool_size: int = 32,
        command_timeout_s: float = 0.5,
        min_discover_interval_s: float = 0.25,
        wait_replicas: int = 0,
    ) -> None:
        self._address = SentinelAddress.from_url(url)
        #: One SSL context for the sentinels and every primary (same options).
        self._tls = TlsContext(self._address.tls_options) if self._address.tls else None
        self._name = name
        self._pool_size = pool_size
        self._timeout_s = command_timeout_s
        self._min_interval_s = min_discover_interval_s
        self._wait: Wire | None = None
        if wait_replicas:
            self._wait = ("WAIT", wait_replicas, max(1, int(command_timeout_s * 500)))
        self._wait_replicas = wait_replicas
        self._fuser = Fuser()
        self._primary: RespBackend | None = None
        self._primary_at: tuple[str, int] | None = None
        self._stale = True
        self._discovered_at = -math.inf
        self._lock = trio.Lock()
        self._switch_hooks: list[Callable[[], Awaitable[object]]] = []
        self._switches = 0
        self._closed = False

    @staticmethod
    def is_sentinel_url(url: str) -> bool:
        return urlsplit(url).scheme in SCHEMES

    @property
    def name(self) -> str:
        return self._name

    @property
    def script_fuser(self) -> Fuser | None:
        return self._fuser

    @property
    def url(self) -> str:
        hosts = ",".join(f"{h}:{p}" for h, p in self._address.sentinels)
        scheme = "rediss+sentinel" if self._address.tls else "redis+sentinel"
        return f"{scheme}://{hosts}/{self._address.service}"

    @property
    def primary(self) -> tuple[str, int] | None:
        """``(host, port)`` of the primary in use, None before the first discovery."""
        return self._primary_at

    @property
    def switches(self) -> int:
        """How many times the primary in use changed after the first discovery."""
        return self._switches

    def __repr__(self) -> str:
        return f"SentinelBackend({self._name!r}, {self.url!r})"

    def add_switch_hook(self, hook: Callable[[], Awaitable[object]]) -> None:
        """Await ``hook()`` after each change of primary (to load scripts, say)."""
        self._switch_hooks.append(hook)

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        primary = await self._current()
        sent = commands if self._wait is None else [*commands, self._wait]
        try:
            replies = await primary.execute(sent)
        except BackendUnavailable:
            self._stale = True
            raise
        for reply in replies:
            if isinstance(reply, CommandError) and reply.reply.startswith(_NOT_PRIMARY):
                self._stale = True
                raise BackendUnavailable(self._name, f"not the primary any more: {reply.reply}")
        if self._wait is not None:
            acked = replies.pop()
            if not isinstance(acked, int) or acked < self._wait_replicas:
                # Perhaps a replica promoted behind our back: ask the sentinels again.
                self._stale = True
                raise BackendUnavailable(
                    self._name, f"{acked!r} of {self._wait_replicas} replicas acknowledged")
        return replies

    @contextlib.asynccontextmanager
    async def open_subscription(self, *channels: str) -> AsyncIterator[Subscription]:
        """A subscription on the current primary (lost, like any, at a failover)."""
        primary = await self._current()
        async with primary.open_subscription(*channels) as subscription:
            yield subscription

    def statistics(self) -> BackendStatistics:
        """The current primary's pool counters (zeros before the first discovery)."""
        if self._primary is None:
            return BackendStatistics(pipelines=0, commands=0, failures=0, connections_open=0,
                                     connections_idle=0, stale_discarded=0, stale_retries=0)
        return self._primary.statistics()

    async def aclose(self) -> None:
        self._closed = True
        if self._primary is not None:
            await self._primary.aclose()
        await trio.lowlevel.checkpoint()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Follow ``+switch-master`` announcements until cancelled (a task of the owner).

        Listens on one sentinel at a time; when it is lost, moves to the next. Between
        announcements, failures found by :meth:`execute` still trigger discovery.
        """
        task_status.started()
        index = 0
        while not self._closed:
            host, port = self._address.sentinels[index % len(self._address.sentinels)]
            index += 1
            sentinel = RespBackend(self._address.sentinel_url(host, port),
                                   name=f"{self._name}-sentinel", pool_size=1,
                                   command_timeout_s=self._timeout_s, tls=self._tls)
            try:
                async with sentinel.open_subscription("+switch-master") as messages:
                    async for _channel, data in messages:
                        # "<service> <old-ip> <old-port> <new-ip> <new-port>"
                        fields = data.decode(errors="replace").split()
                        if fields and fields[0] == self._address.service:
                            logger.warning("sentinel announced a new primary",
                                           extra={"service": self._address.service,
                                                  "primary": " ".join(fields[3:5])})
                            self._stale = True
                            self._discovered_at = -math.inf
                            with contextlib.suppress(BackendUnavailable):
                                await self._current()  # else execute() retries it
            except BackendUnavailable:
                pass
            finally:
                await sentinel.aclose()
            await trio.sleep(_WATCH_RETRY_S)

    async def _current(self) -> RespBackend:
        """The primary to send to, discovered first when the last one is in doubt."""
        if not self._stale and self._primary is not None:
            return self._primary
        async with self._lock:
            if not self._stale and self._primary is not None:
                return self._primary
            now = trio.current_time()
            if now - self._discovered_at < self._min_interval_s and self._primary is None:
                raise BackendUnavailable(self._name, "no primary known (sentinels asked recently)")
            if now - self._discovered_at >= self._min_interval_s:
                self._discovered_at = now
                await self._discover()
            if self._primary is None:
                raise BackendUnavailable(self._name, "no sentinel named a reachable primary")
            return self._primary

    async def _discover(self) -> None:
        """Ask the sentinels in order; switch to the first primary that confirms its role."""
        reasons = []
        for host, port in self._address.sentinels:
            sentinel = RespBackend(self._address.sentinel_url(host, port),
                                   name=f"{self._name}-sentinel", pool_size=1,
                                   command_timeout_s=self._timeout_s, tls=self._tls)
            try:
                (reply,) = await sentinel.execute(
                    [("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._address.service)])
            except BackendUnavailable as exc:
                reasons.append(f"{host}:{port}: {exc.reason}")
                continue
            finally:
                await sentinel.aclose()
            if not isinstance(reply, list) or len(reply) != 2:
                reasons.append(f"{host}:{port}: no primary for {self._address.service!r}")
                continue
            at = (reply[0].decode(), int(reply[1]))
            if await self._adopt(at):
                return
            reasons.append(f"{host}:{port}: {at[0]}:{at[1]} is not a primary")
        logger.warning("no primary found through the sentinels",
                       extra={"service": self._address.service, "reasons": reasons})

    async def _adopt(self, at: tuple[str, int]) -> bool:
        """Use the server at ``at`` if it says it is a primary (``ROLE``)."""
        if at == self._primary_at and self._primary is not None:
            candidate = self._primary
        else:
            candidate = RespBackend(self._address.primary_url(*at), name=self._name,
                                    pool_size=self._pool_size,
                                    command_timeout_s=self._timeout_s, tls=self._tls)
        try:
            (role,) = await candidate.execute([("ROLE",)])
        except BackendUnavailable:
            role = None
        if not (isinstance(role, list) and role and role[0] == b"master"):
            if candidate is not self._primary:
                await candidate.aclose()
            return False
        if candidate is not self._primary:
            old, first = self._primary, self._primary is None
            self._primary, self._primary_at = candidate, at
            if old is not None:
                await old.aclose()
            if not first:
                self._switches += 1
                logger.warning("following a new primary",
                               extra={"service": self._address.service,
                                      "primary": f"{at[0]}:{at[1]}"})
            self._stale = False  # before the hooks: they send through this backend
            for hook in self._switch_hooks:
                await hook()
        self._stale = False
        return True


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a sentinel is host:port, got {text!r}")
    return host.strip("[]"), int(port)


def _quote(text: str | None) -> str:
    return quote(text or "", safe="")



