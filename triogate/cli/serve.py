"""``triogate serve``: load the config, refuse unsafe addresses, run one worker or supervise many.

Imported only when ``serve`` runs (``triogate.cli`` dispatches lazily): this module may
pull in trio; the gateway itself (its HTTP server, SQLAlchemy, ``triogate.app``) is imported
only once the config has loaded.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
from functools import partial
from typing import TYPE_CHECKING

import trio

from triogate.errors import ConfigError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from pathlib import Path

    from triogate.config import GatewayConfig

logger = logging.getLogger("triogate.cli")


def load(path: Path | None, environ: Mapping[str, str]) -> GatewayConfig:
    """Load the config (the packaged default when None) with the process's environment."""
    from triogate.config import load_config

    return load_config(path, environ=environ)


#: The example config's master key: fine on loopback, refused anywhere else.
EXAMPLE_MASTER_KEY = "sk-triogate-dev"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Serve until SIGINT/SIGTERM; the exit status.

    Raises:
        ConfigError: bad config, or an unsafe master key on a public address.
    """
    config = load(args.config, environ)
    from triogate.app import check_redis_url

    check_redis_url(config.settings.redis.url)
    if config.master_key is None:
        logger.warning("no master_key configured: every request is accepted without a key")
    if args.host not in _LOOPBACK and config.master_key in (None, EXAMPLE_MASTER_KEY):
        raise ConfigError(
            f"refusing to listen on {args.host} with "
            + ("no master key" if config.master_key is None else "the example master key")
            + ": set general_settings.master_key or TRIOGATE_MASTER_KEY"
        )
    from triogate.server import raise_open_files_limit

    before, after = raise_open_files_limit()  # workers inherit it
    if after > before:
        logger.info("open-files limit raised from %d to %d", before, after)
    if args.workers > 1 and args.listen_fd is None:
        return _supervise(args, config, environ)
    from triogate.app import serve

    trio.run(partial(serve, config, host=args.host, port=args.port, listen_fd=args.listen_fd))
    return 0


def _supervise(args: argparse.Namespace, config: GatewayConfig,
               environ: Mapping[str, str]) -> int:
    """Run ``--workers`` processes on one listening socket; share one Redis between them.

    The supervisor binds the port once and passes the socket down; with the embedded
    default it also runs the Redis-compatible server every worker talks to. SIGINT and
    SIGTERM are forwarded; the supervisor exits when every worker has drained.
    """
    from triogate.redis_server import SyncServer

    env = dict(environ)
    server = None
    if config.settings.redis.url is None:
        server = SyncServer(config.state_dir / "redis", persistent=True)
        env["TRIOGATE_REDIS_URL"] = server.url
    # Each worker listens on it again with triogate.app.LISTEN_BACKLOG (the same size).
    listener = socket.create_server((args.host, args.port), backlog=4096)
    listener.set_inheritable(True)
    fd = listener.fileno()
    command = [sys.executable, "-m", "triogate", "serve", "--host", args.host,
               "--port", str(listener.getsockname()[1]), "--listen-fd", str(fd)]
    if args.config is not None:
        command += ["--config", str(args.config)]
    # Workers get signals from the supervisor only (one SIGTERM each), not the terminal's.
    workers = [subprocess.Popen(command, pass_fds=[fd], env=env, start_new_session=True)
               for _ in range(args.workers)]
    logger.info("supervising workers", extra={"workers": args.workers,
                                               "port": listener.getsockname()[1]})

    def forward(signum: int, _frame: object) -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    codes = [worker.wait() for worker in workers]
    listener.close()
    if server is not None:
        server.stop()
    return max(codes, default=0)
