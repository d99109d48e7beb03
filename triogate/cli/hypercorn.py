"""``triogate serve --server hypercorn``: the gateway's ASGI application under hypercorn's
trio worker, for TLS (``--certfile/--keyfile``) and HTTP/2 (ALPN over TLS, h2c and prior
knowledge over cleartext) in the gateway itself.

One worker runs in this process. With ``--workers N`` hypercorn spawns N processes that
each import :data:`triogate.asgi.app` (the config reaches them as ``TRIOGATE_CONFIG``);
with the embedded Redis default this process runs the one server they share, as the own
server's supervisor does, holding the state folder's lock.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import trio

from triogate.errors import ConfigError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from hypercorn.config import Config

    from triogate.config import GatewayConfig


def hypercorn_config(args: argparse.Namespace, config: GatewayConfig) -> Config:
    """hypercorn's settings from the command line and the gateway's own (grace period,
    keep-alive, head size, listen backlog, body read timeout).

    Raises:
        ConfigError: only one of ``--certfile`` and ``--keyfile``, or a file missing.
    """
    from hypercorn.config import Config

    from triogate.app import KEEP_ALIVE_S, LISTEN_BACKLOG

    if bool(args.certfile) != bool(args.keyfile):
        raise ConfigError("--certfile and --keyfile go together")
    for path in (args.certfile, args.keyfile):
        if path is not None and not path.is_file():
            raise ConfigError(f"cannot read {path}")
    settings = config.settings
    hc = Config()
    host = f"[{args.host}]" if ":" in args.host else args.host
    hc.bind = [f"{host}:{args.port}"]
    hc.worker_class = "trio"
    hc.workers = args.workers
    hc.application_path = "triogate.asgi:app"
    if args.certfile:
        hc.certfile = str(args.certfile)
        hc.keyfile = str(args.keyfile)
    hc.alpn_protocols = ["h2", "http/1.1"]
    hc.graceful_timeout = settings.shutdown_grace_s
    hc.shutdown_timeout = settings.shutdown_grace_s * 3 + 30  # the drain has its own bound
    hc.keep_alive_timeout = KEEP_ALIVE_S
    hc.read_timeout = int(settings.http.body_read_timeout_s)
    hc.backlog = LISTEN_BACKLOG
    hc.h11_max_incomplete_size = 16 * 1024
    hc.include_server_header = False
    hc.accesslog = None
    return hc


def run_hypercorn(args: argparse.Namespace, config: GatewayConfig,
                  environ: Mapping[str, str]) -> int:
    """Serve under hypercorn until SIGINT/SIGTERM; the exit status.

    Raises:
        ConfigError: bad TLS options, the state folder in use, or the gateway did not start.
    """
    try:
        import hypercorn  # noqa: F401
    except ImportError:
        raise ConfigError("--server hypercorn needs hypercorn: pip install "
                          "'triogate[hypercorn]'") from None
    hc = hypercorn_config(args, config)
    if args.workers > 1:
        return _supervise(args, config, environ, hc)
    from hypercorn.trio import serve
    from hypercorn.utils import LifespanFailureError

    from triogate.asgi import create_app

    app = create_app(config=config, setup_logging=False)  # triogate.cli set logging up

    async def stop_on_signal() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for _ in received:
                return

    try:
        trio.run(lambda: serve(app, hc, shutdown_trigger=stop_on_signal))  # type: ignore[arg-type]
    except* LifespanFailureError:
        # The lifespan logged why; the operator's one line says it again.
        raise ConfigError(app.failure or "the gateway did not start") from None
    return 0


def _supervise(args: argparse.Namespace, config: GatewayConfig, environ: Mapping[str, str],
               hc: Config) -> int:
    """hypercorn's own worker processes, sharing one Redis (the embedded one: ours)."""
    from hypercorn.run import run

    from triogate.redis_server import SyncServer

    server = None
    if config.settings.redis.url is None:
        server = SyncServer(config.state_dir / "redis", persistent=True)
        os.environ["TRIOGATE_REDIS_URL"] = server.url
    if args.config is not None:
        os.environ["TRIOGATE_CONFIG"] = str(args.config.resolve())
    for name in ("TRIOGATE_LOG_LEVEL", "TRIOGATE_MASTER_KEY"):
        if name in environ:
            os.environ[name] = environ[name]
    try:
        return run(hc)
    finally:
        if server is not None:
            server.stop()
