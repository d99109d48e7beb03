"""``triogate serve | keys | teams | users | tags | bench``: argument parsing, no logic.

The environment is read here and in ``config.expand_env``, nowhere else.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from triogate import admin_cli
from triogate._log import configure_logging
from triogate.bench import roundtrips as bench_roundtrips
from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from triogate.config import GatewayConfig

logger = logging.getLogger("triogate.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triogate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, help="YAML config (default: the example config)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=4000)
    serve.add_argument("--workers", type=int, default=1, help="processes sharing one port")
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    admin_cli.add_parsers(sub)
    bench_roundtrips.add_parser(sub)
    return parser


def load(path: Path | None) -> GatewayConfig:
    """Load the config with this process's environment (the one place it is read)."""
    from triogate.config import load_config

    return load_config(path, environ=os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    configure_logging(os.environ.get("TRIOGATE_LOG_LEVEL", "info"))
    if args.command == "bench":
        return bench_roundtrips.run(args)
    if args.command in admin_cli.COMMANDS:
        return admin_cli.run(args, os.environ)
    try:
        return _serve(args)
    except ConfigError as exc:
        print(f"triogate: {exc}", file=sys.stderr)
        return 2


#: The example config's master key: fine on loopback, refused anywhere else.
EXAMPLE_MASTER_KEY = "sk-triogate-dev"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _serve(args: argparse.Namespace) -> int:
    config = load(args.config)
    if config.master_key is None:
        logger.warning("no master_key configured: every request is accepted without a key")
    if args.host not in _LOOPBACK and config.master_key in (None, EXAMPLE_MASTER_KEY):
        raise ConfigError(
            f"refusing to listen on {args.host} with "
            + ("no master key" if config.master_key is None else "the example master key")
            + ": set general_settings.master_key or TRIOGATE_MASTER_KEY"
        )
    if args.workers > 1 and args.listen_fd is None:
        return _supervise(args, config)
    from triogate.app import serve

    trio.run(partial(serve, config, host=args.host, port=args.port, listen_fd=args.listen_fd))
    return 0


def _supervise(args: argparse.Namespace, config: GatewayConfig) -> int:
    """Run ``--workers`` processes on one listening socket; share one Redis between them.

    The supervisor binds the port once and passes the socket down; with the embedded
    default it also runs the Redis-compatible server every worker talks to. SIGINT and
    SIGTERM are forwarded; the supervisor exits when every worker has drained.
    """
    from triogate.redis_server import SyncServer

    env = dict(os.environ)
    server = None
    if config.settings.redis.url is None:
        server = SyncServer(config.state_dir / "redis", persistent=True)
        env["TRIOGATE_REDIS_URL"] = server.url
    listener = socket.create_server((args.host, args.port), backlog=2048)
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


if __name__ == "__main__":
    raise SystemExit(main())
