"""Handle: the promise of one command's reply, resolved by a flush."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, final

import trio

from ._errors import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Generator

    from ._command import Command

T = TypeVar("T")


class _Source(Protocol):
    async def _wait_handle(self, handle: Handle[Any]) -> Any: ...


@final
class _Settled:
    """The source of a post-call handle once its batch has settled: awaiting the handle
    is then a checkpoint and its result, as the batch itself would give.

    The batch lists its handles and each handle names its batch: a reference cycle per
    request, left to the cyclic collector (with the batch's commands, replies and
    event). Pointing the settled handles here instead lets reference counting free them.
    """

    __slots__ = ()

    async def _wait_handle(self, handle: Handle[Any]) -> Any:
        await trio.lowlevel.checkpoint()
        return handle.result()


SETTLED: _Source = _Settled()


@final
class Handle(Generic[T]):
    """The reply to one declared command, available once its flush has run.

    ``await handle`` waits for the shared flush (in a batch scope, this is what lets the
    flush happen: the awaiting participant counts as waiting) and returns the reply, or
    raises this owner's error only: :class:`CommandError` for an error reply,
    :class:`BackendUnavailable` if the pipeline failed as a whole. Awaiting a handle that
    is already resolved returns at once; in a batch scope that await is a cancel point
    but not a schedule point (the round's wait was one; the replies of a round resolve
    together, and a participant reading them one by one would otherwise yield for each).
    Handles are made by ``Batch.call``; there is no public constructor.
    """

    __slots__ = ("_command", "_done", "_error", "_source", "_value", "_waiters")

    _command: Command
    _source: _Source
    _done: bool
    _value: object
    _error: BaseException | None
    _waiters: list[trio.lowlevel.Task]

    def __init__(self) -> None:
        raise TypeError("Handle has no public constructor; use Batch.call")

    @classmethod
    def _create(cls, command: Command, source: _Source) -> Handle[Any]:
        self = object.__new__(cls)
        self._command = command
        self._source = source
        self._done = False
        self._value = None
        self._error = None
        self._waiters = []
        return self

    def _set(self, reply: object) -> list[trio.lowlevel.Task]:
        """Resolve with ``reply`` (an exception instance fails it); return the waiters to wake.

        A shared pipeline error becomes this owner's own instance. Resolving twice is a
        no-op (a cancelled flush fails only what it had not delivered).
        """
        if self._done:
            return []
        self._done = True
        if isinstance(reply, BackendUnavailable):
            fresh = BackendUnavailable(reply.backend, reply.reason)
            fresh.__cause__ = reply.__cause__
            self._error = fresh
        elif isinstance(reply, BaseException):
            self._error = reply
        else:
            self._value = reply
        waiters, self._waiters = self._waiters, []
        return waiters

    @property
    def command(self) -> Command:
        """The command this handle stands for."""
        return self._command

    @property
    def done(self) -> bool:
        """Whether the reply (or error) is there."""
        return self._done

    def result(self) -> T:
        """The reply, without waiting.

        Raises:
            RuntimeError: the handle is not resolved yet.
            CommandError, BackendUnavailable: as for ``await``.
        """
        if not self._done:
            raise RuntimeError(f"{self!r} is not resolved yet")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def __await__(self) -> Generator[Any, None, T]:
        return self._source._wait_handle(self).__await__()

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<Handle {self._command.label} owner={self._command.owner} {state}>"
