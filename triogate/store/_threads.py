"""Run blocking SQL in trio worker threads, and map its errors to :class:`StoreError`.

Neither sqlite3 nor sync psycopg speaks trio, so every query of the store runs in
``trio.to_thread.run_sync`` behind one :class:`trio.CapacityLimiter` per store: the event
loop never waits on the database, and no more threads queue on the database than its
connection pool can serve.

Threads are not abandoned on cancellation (``abandon_on_cancel=False``): a cancelled
caller waits for its statement to finish, so a transaction is never left half-known (the
spend-log writer relies on this to know whether a batch was written).

Errors are mapped at this boundary (httpcore's ``map_exceptions`` idea): SQLAlchemy and
OS errors become :class:`~triogate.errors.StoreError`, raised ``from`` the original, with a
one-line message from which every secret given at construction (the database password)
has been scrubbed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar, final

import sqlalchemy.exc
import trio

from triogate.errors import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

T = TypeVar("T")

logger = logging.getLogger("triogate.store")

_MAX_MESSAGE_CHARS = 300


class StoreConflict(StoreError):
    """Raised by the store's ``create_*`` methods when the id (or key) already exists."""


class StoreDataError(StoreError):
    """The database refused the data itself (a NUL byte in a PostgreSQL string, a number
    out of range): the same statement with the same values fails again, however often it
    is retried. Every other :class:`StoreError` may be transient."""


@final
class SqlThreads:
    """The store's worker threads: a capacity limit plus error mapping.

    Args:
        max_threads: statements running at once (the connection pool's size).
        secrets: strings that must never appear in an error message (the password).
    """

    def __init__(self, max_threads: int, *, secrets: Iterable[str | None] = ()) -> None:
        self.limiter = trio.CapacityLimiter(max_threads)
        self._probe_limiter = trio.CapacityLimiter(1)
        self._secrets = tuple(s for s in secrets if s)

    async def run(self, op: str, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` in a worker thread; a checkpoint.

        Args:
            op: what is being done ("create key"), for the error message.
            fn: a blocking function (it opens its own connection from the pool).
            args: its positional arguments.

        Raises:
            StoreConflict: a unique constraint refused the write.
            StoreDataError: the values themselves were refused (retrying cannot help).
            StoreError: any other database or I/O failure.
        """
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)
        except sqlalchemy.exc.IntegrityError as exc:
            raise StoreConflict(self.message(op, exc)) from exc
        except (sqlalchemy.exc.DataError, OverflowError) as exc:
            # OverflowError: sqlite3 refuses an int beyond 64 bits before SQLAlchemy
            # sees it, so it arrives unwrapped.
            raise StoreDataError(self.message(op, exc)) from exc
        except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
            raise StoreError(self.message(op, exc)) from exc

    async def probe(self, op: str, fn: Callable[..., T], *args: object) -> T:
        """Like :meth:`run`, for a read-only check whose caller's deadline must hold.

        A cancelled caller does not wait for the thread (it is abandoned, and finishes
        on its own: connect and statement timeouts bound it). One probe thread at most:
        while an abandoned one still hangs, the next probe waits for it, cancellably,
        rather than piling threads onto a database that does not answer. Not counted in
        :attr:`limiter`, so a probe never waits behind a queue of writes either.
        """
        try:
            return await trio.to_thread.run_sync(
                fn, *args, limiter=self._probe_limiter, abandon_on_cancel=True
            )
        except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
            raise StoreError(self.message(op, exc)) from exc

    def message(self, op: str, exc: BaseException) -> str:
        """``"<op> failed: <Type>: <first line>"`` with every secret replaced by ``***``.

        The driver's own exception (``exc.orig``) is used when there is one: SQLAlchemy's
        text adds the statement and its parameters, which belong in a debugger, not a log.
        """
        orig = getattr(exc, "orig", None) or exc
        lines = str(orig).strip().splitlines()
        text = lines[0] if lines else ""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        if len(text) > _MAX_MESSAGE_CHARS:
            text = text[:_MAX_MESSAGE_CHARS] + "..."
        return f"{op} failed: {type(orig).__name__}: {text}"
