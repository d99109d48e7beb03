"""The gateway as an importable ASGI application, for any ASGI server that runs lifespan.

    hypercorn --worker-class trio triogate.asgi:app

``app`` is configured from ``TRIOGATE_CONFIG`` (a YAML path; the packaged example when
unset), read when the server starts it; :func:`create_app` makes one for a given path.
Its ASGI lifespan owns the app nursery (:func:`triogate.app.open_gateway`): startup opens
Redis (or the embedded server), the settler, the SQL store and the spend-log writer;
shutdown, which the server sends once it stopped accepting and its requests in flight
finished, drains them exactly as ``triogate serve`` does. The running gateway lives in
the lifespan's state (ASGI's ``scope["state"]``), not in this module: the application
object holds only its configuration.

What ``triogate serve`` does around its server happens here too, through the same
functions (:func:`triogate.app.prepare_process`, :func:`triogate.app.tune_gc`): the
open-gateway warning, the open-files limit, the collector's tuning. The bind-address
check cannot run at startup (an ASGI server binds after lifespan startup, and does not
say where): with no master key or the example one, a request that arrived on an address
that is not loopback is refused with 503 instead, and the refusal logged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triogate.api.asgi import GatewayASGI
from triogate.app import (
    LOOPBACK,
    insecure_key,
    open_gateway,
    prepare_process,
    tune_gc,
    wall_clock_ms,
)
from triogate.errors import TriogateError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.api.services import Services
    from triogate.config import GatewayConfig

logger = logging.getLogger("triogate")

#: Where the lifespan puts the running gateway in the ASGI state.
STATE_KEY = "triogate.gateway"
#: The environment variable naming the config file of :data:`app`.
CONFIG_ENV = "TRIOGATE_CONFIG"

Receive = Any
Send = Any


class GatewayApp:
    """An ASGI 3 application whose lifespan runs the gateway (see the module docstring).

    ``config`` (an already parsed config) takes the place of ``config_path``;
    ``on_ready`` is called with the services once startup completed (tests read the
    tracer and the store through it); ``setup_logging`` sends log lines to stderr as
    JSON (``TRIOGATE_LOG_LEVEL``), as ``triogate serve`` does.
    """

    def __init__(self, config_path: str | Path | None = None, *,
                 config: GatewayConfig | None = None,
                 environ: Mapping[str, str] | None = None,
                 on_ready: Callable[[Services], None] | None = None,
                 clock_ms: Callable[[], int] = wall_clock_ms,
                 setup_logging: bool = True) -> None:
        self._path = Path(config_path) if config_path is not None else None
        self._config = config
        self._environ = environ
        self._on_ready = on_ready
        self._clock_ms = clock_ms
        self._setup_logging = setup_logging
        #: Why the last startup failed (the line the server was sent), if it did.
        self.failure: str | None = None

    def load(self) -> GatewayConfig:
        """The gateway's config (``config``, else the file, else ``TRIOGATE_CONFIG``).

        Raises:
            ConfigError: unreadable or invalid config.
        """
        if self._config is not None:
            return self._config
        from triogate.config import load_config

        environ = self._environ if self._environ is not None else os.environ
        path = self._path
        if path is None and environ.get(CONFIG_ENV):
            path = Path(environ[CONFIG_ENV])
        return load_config(path, environ=environ)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        state = scope.get("state")
        gateway = state.get(STATE_KEY) if state is not None else None
        if not isinstance(gateway, GatewayASGI):
            if kind == "http":
                await _refuse(send, "the gateway is not started: its ASGI server must run the "
                                    "lifespan protocol (hypercorn does)")
            return
        if gateway.insecure is not None and kind == "http":
            host = (scope.get("server") or ("127.0.0.1", None))[0]
            if isinstance(host, str) and host not in LOOPBACK and "/" not in host:
                logger.error("refused a request on %s: %s", host, gateway.insecure)
                await _refuse(send, f"refusing to serve on {host} with {gateway.insecure}: set "
                                    "general_settings.master_key or TRIOGATE_MASTER_KEY")
                return
        await gateway(scope, receive, send)

    async def _lifespan(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        state = scope.get("state")
        if state is None:
            await send({"type": "lifespan.startup.failed",
                        "message": "the ASGI server offers no lifespan state"})
            return
        started = False
        try:
            if self._setup_logging:
                from triogate._log import configure_logging

                configure_logging(os.environ.get("TRIOGATE_LOG_LEVEL", "info"))
            config = self.load()
            prepare_process(config, None)
            async with open_gateway(config, clock_ms=self._clock_ms) as services:
                gateway = GatewayASGI(services)
                gateway.insecure = insecure_key(config)
                tune_gc()
                state[STATE_KEY] = gateway
                if self._on_ready is not None:
                    self._on_ready(services)
                started = True
                await send({"type": "lifespan.startup.complete"})
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
                # The server stopped accepting and its requests finished (or met its
                # grace period): open_gateway's exit drains the settler and the writer.
                state.pop(STATE_KEY, None)
        except Exception as exc:
            lines = operator_lines(exc)
            if started or lines is None:
                raise
            failure = "; ".join(lines)
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return
        # Outside the handler: the server's own report of the failure chains no traceback.
        logger.error("gateway not started: %s", failure)
        self.failure = failure
        await send({"type": "lifespan.startup.failed", "message": failure})


def create_app(config_path: str | Path | None = None, **options: Any) -> GatewayApp:
    """The gateway as an ASGI application configured from ``config_path`` (the packaged
    example when None and ``TRIOGATE_CONFIG`` is unset); ``options`` as :class:`GatewayApp`.
    Nothing starts until the server runs its lifespan."""
    return GatewayApp(config_path, **options)


#: ``hypercorn --worker-class trio triogate.asgi:app``: configured from ``TRIOGATE_CONFIG``.
app = create_app()


def operator_lines(exc: BaseException) -> list[str] | None:
    """One line per distinct error an operator can fix in ``exc`` (a group's leaves), or
    None when any of them is not one (a bug: its traceback must stay)."""
    found: list[BaseException] = []
    pending = [exc]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        else:
            found.append(current)
    if not all(isinstance(leaf, (TriogateError, OSError)) for leaf in found):
        return None
    return list(dict.fromkeys(" ".join(str(leaf).split()) for leaf in found))


async def _refuse(send: Send, message: str) -> None:
    import orjson

    body = orjson.dumps({"error": {"message": message, "type": "service_unavailable",
                                   "param": None, "code": "not_serving"}})
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


__all__ = ("CONFIG_ENV", "GatewayApp", "app", "create_app")
