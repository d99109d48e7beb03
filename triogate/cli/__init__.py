"""``triogate serve | keys | teams | users | tags | bench``: argument parsing and dispatch.

Building the parser imports argparse, httpx (the admin commands' client) and small leaf
modules only; a command's module is imported when that command runs. So ``triogate keys
list`` never pays for the HTTP server, SQLAlchemy or the gateway (``tests/unit/test_cli.py``
checks it in a subprocess).

Errors the operator can fix (a bad config, an unreachable database, a port in use) end as
one line on stderr and exit status 2, whatever nursery they crossed on the way out:
exception groups are unwrapped to their leaves. Anything else is a bug and keeps its
traceback.

The environment is read here (passed down as a mapping) and in ``config.expand_env``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from triogate.bench.options import add_roundtrips_arguments
from triogate.cli import admin
from triogate.errors import TriogateError

if TYPE_CHECKING:
    from collections.abc import Sequence

#: Exit status for an error the operator can fix (bad config, unreachable server...).
EXIT_USAGE = 2
#: What counts as such an error when it ends a command (the leaves of a group included).
OPERATOR_ERRORS: tuple[type[Exception], ...] = (TriogateError, OSError)


def parser() -> argparse.ArgumentParser:
    """The whole command line (cheap: no command module beyond ``admin`` is imported)."""
    top = argparse.ArgumentParser(
        prog="triogate", description="An OpenAI- and Anthropic-compatible LLM gateway on Trio.")
    sub = top.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path,
                       help="YAML config (default: triogate/example.yaml, packaged with "
                            "triogate; config/gateway.yaml is a copy of it)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=4000, help="port (default 4000)")
    serve.add_argument("--workers", type=int, default=1,
                       help="processes sharing one port (default 1)")
    serve.add_argument("--server", choices=("triogate", "hypercorn"), default="triogate",
                       help="HTTP server: the gateway's own HTTP/1.1 one, or hypercorn "
                            "(TLS, HTTP/2) (default triogate)")
    serve.add_argument("--certfile", type=Path, help="TLS certificate (PEM; --server hypercorn)")
    serve.add_argument("--keyfile", type=Path, help="TLS private key (PEM; --server hypercorn)")
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    admin.add_parsers(sub)
    bench = sub.add_parser("bench", help="benchmarks (see docs/benchmarks.md)")
    which = bench.add_subparsers(dest="bench_command", required=True)
    add_roundtrips_arguments(
        which.add_parser("roundtrips", help="count Redis waits per request shape"))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``triogate`` and ``python -m triogate``); returns the exit status."""
    args = parser().parse_args(argv)
    if args.command in admin.COMMANDS:
        return admin.run(args, os.environ)
    from triogate._log import configure_logging

    configure_logging(os.environ.get("TRIOGATE_LOG_LEVEL", "info"))
    try:
        if args.command == "bench":
            from triogate.bench import roundtrips

            return roundtrips.run(args)
        from triogate.cli import serve

        return serve.run(args, os.environ)
    except Exception as exc:  # an ExceptionGroup too; a BaseExceptionGroup goes by
        problems = operator_errors(exc)
        if problems is None:
            raise
        for line in problems:
            print(f"triogate: {line}", file=sys.stderr)
        return EXIT_USAGE


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, nested groups flattened (``exc`` itself if no group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def operator_errors(exc: BaseException) -> list[str] | None:
    """One line per distinct operator error in ``exc``, or None when anything in it is not
    one (a bug: its traceback must stay)."""
    found = leaves(exc)
    if not all(isinstance(leaf, OPERATOR_ERRORS) for leaf in found):
        return None
    return list(dict.fromkeys(_line(leaf) for leaf in found))


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # one line, whatever the message held
    if isinstance(exc, OSError) and not isinstance(exc, TriogateError):
        return f"{type(exc).__name__}: {text}"
    return text
