"""The batch scope: a nursery whose participants share one flush per dependency level.

A request opens one scope. Subsystems run in it as *participants*; each declares the
commands it needs (``scope.batch.call(...)``, sync, never blocks) and awaits the handles.
The scope flushes the moment every live participant is waiting (on a handle, or on
another participant's result) or has finished: everything declared so far leaves as one
pipeline per backend. A participant that declares after a flush is in the next round.
So the number of waits equals the depth of the dependency chain.

With ``host=True`` the scope's body is itself a participant, live until it exits: it can
run participants in its own task (``BatchScope.run_inline``), which spares the spawn and
the scheduling of a task per participant; only its last declaration before a wait may
wait inline (calls run one after another). A host that is the only live participant
sends its round from its own task when it waits (no flush task: nobody else could
declare meanwhile). A host scope opened with ``tasks=False`` has no nursery at all: every
participant runs inline and every round leaves from the host (what admission uses).

Participants' exceptions are captured (``Exception`` only; cancellation propagates):
one subsystem failing does not cancel the others, and ``Participant.result()`` re-raises
it for whoever decides. Cancelling the scope (the client went away) cancels the
participants and any flush in flight; a cancelled flush fails the handles it carried,
so nothing is left dangling.
"""

from __future__ import annotations

import itertools
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, final

import attrs
import outcome
import trio

from ._barrier import Barrier
from ._command import Command
from ._errors import BackendUnavailable, BatchClosed
from ._flush import send_round
from ._handle import Handle
from ._scripts import Script
from ._tracer import BEFORE, FlushRecord

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
    from contextlib import AbstractAsyncContextManager

    from ._backend import Backend
    from ._command import Arg
    from ._flush import PipelineSent
    from ._tracer import Tracer

T = TypeVar("T")

_trace_ids = itertools.count(1)


def make_command(
    target: str | Script,
    keys: Iterable[Arg],
    args: Iterable[Arg],
    backend: str,
    owner: str,
    backends: Mapping[str, Backend],
) -> Command:
    """Validate one declaration and build its :class:`Command` (shared by both batches)."""
    if backend not in backends:
        raise ValueError(f"unknown backend {backend!r} (known: {', '.join(sorted(backends))})")
    if isinstance(target, Script):
        return Command(
            name="EVALSHA", keys=tuple(keys), args=tuple(args), owner=owner, backend=backend,
            script=target,
        )
    return Command(name=target.upper(), keys=tuple(keys), args=tuple(args), owner=owner,
                   backend=backend)


@final
@attrs.frozen(kw_only=True)
class BatchStatistics:
    """What a scope did so far.

    Attributes:
        rounds: flushes (waits) so far; a NOSCRIPT retry is not a round.
        commands: commands sent.
        participants: participants started.
        live: participants still running.
        waiting: live participants blocked on the batch right now.
        pending: commands declared and not yet sent.
    """

    rounds: int
    commands: int
    participants: int
    live: int
    waiting: int
    pending: int


@final
class Participant(Generic[T]):
    """A subsystem task of a batch scope, and later its result.

    Made by :meth:`BatchScope.start_participant`; no public constructor.
    """

    __slots__ = ("_blocked_on", "_done", "_error", "_name", "_scope", "_value", "_waiters")

    _name: str
    _scope: BatchScope
    _blocked_on: list[trio.lowlevel.Task] | None
    _done: bool
    _value: Any
    _error: Exception | None
    _waiters: list[trio.lowlevel.Task]

    def __init__(self) -> None:
        raise TypeError("Participant has no public constructor; use start_participant")

    @classmethod
    def _create(cls, name: str, scope: BatchScope) -> Participant[Any]:
        self = object.__new__(cls)
        self._name = name
        self._scope = scope
        self._blocked_on = None
        self._done = False
        self._value = None
        self._error = None
        self._waiters = []
        return self

    @property
    def name(self) -> str:
        """The name given at start."""
        return self._name

    @property
    def done(self) -> bool:
        """Whether the participant has returned or raised."""
        return self._done

    def result(self) -> T:
        """The participant's return value, or its exception re-raised.

        Raises:
            RuntimeError: the participant has not finished.
        """
        if not self._done:
            raise RuntimeError(f"participant {self._name!r} has not finished")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    async def wait(self) -> T:
        """Wait for this participant's result; a participant waiting here counts as waiting.

        This is how a dependency is expressed: the rate-limit participant awaits the auth
        participant's result, and the flush of the current round is not held back by it.
        A checkpoint.
        """
        await self._scope._wait_participant(self)
        return self.result()

    def __repr__(self) -> str:
        return f"<Participant {self._name!r} {'done' if self._done else 'running'}>"


@final
class BatchScope:
    """A nursery plus a batch; see the module docstring. Made by :func:`open_batch_scope`."""

    #: Where participants declare their commands.
    batch: Batch
    _nursery: trio.Nursery | None
    _backends: Mapping[str, Backend]
    _tracer: Tracer | None
    _trace_id: str
    _phase: str
    _barrier: Barrier
    _by_task: dict[trio.lowlevel.Task, Participant[Any]]
    _pending: list[Handle[Any]]
    _flushing: bool
    _closed: bool
    _rounds: int
    _commands: int
    _started: int
    _host: Participant[None] | None

    def __init__(self) -> None:
        raise TypeError("use open_batch_scope")

    @classmethod
    def _create(
        cls,
        nursery: trio.Nursery | None,
        backends: Mapping[str, Backend],
        tracer: Tracer | None,
        trace_id: str,
        phase: str,
        rounds_before: int = 0,
    ) -> BatchScope:
        self = object.__new__(cls)
        self._nursery = nursery
        self._backends = backends
        self._tracer = tracer
        self._trace_id = trace_id
        self._phase = phase
        self._barrier = Barrier()
        self._by_task = {}
        self._pending = []
        self._flushing = False
        self._closed = False
        self._rounds = rounds_before
        self._commands = 0
        self._started = 0
        self._host = None
        self.batch = Batch._create(self)
        return self

    @property
    def trace_id(self) -> str:
        """The id under which this scope's flushes are traced."""
        return self._trace_id

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """The scope's cancel scope: cancel it to abandon every participant and flush.

        Raises:
            RuntimeError: a scope opened with ``tasks=False`` has none of its own (it runs
                in its host's task: cancel the host's).
        """
        if self._nursery is None:
            raise RuntimeError("a scope opened with tasks=False has no cancel scope")
        return self._nursery.cancel_scope

    def start_participant(
        self, fn: Callable[..., Awaitable[T]], *args: object, name: str | None = None
    ) -> Participant[T]:
        """Run ``fn(*args)`` as a participant task; return its :class:`Participant`.

        The participant counts as live from this call on, so a round cannot leave before
        it has run and declared. May be called from the scope's body or from inside a
        participant (to start a dependent step). Not a checkpoint.

        Raises:
            RuntimeError: the scope was opened with ``tasks=False``.
        """
        if self._closed:
            raise BatchClosed("the batch scope is closed")
        if self._nursery is None:
            raise RuntimeError("a scope opened with tasks=False runs no participant task; "
                               "use run_inline")
        label = name or str(getattr(fn, "__qualname__", repr(fn)))
        participant: Participant[T] = Participant._create(label, self)
        self._barrier.started()
        self._started += 1
        self._nursery.start_soon(self._run_participant, participant, fn, args, name=label)
        return participant

    async def run_inline(
        self, fn: Callable[..., Awaitable[T]], *args: object, name: str | None = None
    ) -> Participant[T]:
        """Run ``fn(*args)`` in the calling task, the scope's host; return it as a finished
        :class:`Participant`.

        Only in a scope opened with ``host=True``, from its body: the body counts as one
        live participant from entry to exit, so ``fn`` waiting on a handle counts as the
        body waiting, and a round leaves when every other participant waits too. What a
        task would cost (a spawn, a first schedule, an exit, a wake-up of the nursery) is
        not paid. Calls run one after another: only the last declaration of a round may
        wait in an inline call (a call that waits first sends the round without what is
        declared after it). ``fn``'s ``Exception`` is captured as for
        :meth:`start_participant`; cancellation propagates. A checkpoint if ``fn`` is.

        Raises:
            RuntimeError: not called from the body of a ``host=True`` scope.
        """
        host = self._host
        if host is None or self._by_task.get(trio.lowlevel.current_task()) is not host:
            raise RuntimeError("run_inline needs the body of a scope opened with host=True")
        if self._closed:
            raise BatchClosed("the batch scope is closed")
        participant: Participant[T] = Participant._create(
            name or str(getattr(fn, "__qualname__", repr(fn))), self)
        self._started += 1
        try:
            participant._value = await fn(*args)
        except Exception as exc:  # captured, as a task participant's would be
            participant._error = exc
        participant._done = True
        return participant

    def _enter_host(self) -> None:
        host: Participant[None] = Participant._create("host", self)
        self._host = host
        self._by_task[trio.lowlevel.current_task()] = host
        self._barrier.started()

    def _leave_host(self) -> None:
        host = self._host
        if host is None or host._done:
            return
        host._done = True
        self._by_task.pop(trio.lowlevel.current_task(), None)
        self._barrier.finished()
        waiters, host._waiters = host._waiters, []
        for waiter in waiters:
            self._wake(waiter, outcome.Value(None))

    @property
    def rounds(self) -> int:
        """Rounds (waits) this scope has sent so far: ``statistics().rounds`` without
        building the record (read once per request)."""
        return self._rounds

    def statistics(self) -> BatchStatistics:
        """Counters of this scope (sync, cheap)."""
        return BatchStatistics(
            rounds=self._rounds,
            commands=self._commands,
            participants=self._started,
            live=self._barrier.live,
            waiting=self._barrier.blocked,
            pending=len(self._pending),
        )

    # ------------------------------------------------------------------ participants

    async def _run_participant(
        self,
        participant: Participant[Any],
        fn: Callable[..., Awaitable[Any]],
        args: tuple[object, ...],
    ) -> None:
        task = trio.lowlevel.current_task()
        self._by_task[task] = participant
        try:
            participant._value = await fn(*args)
        except Exception as exc:  # captured: see module docstring; Cancelled propagates
            participant._error = exc
        finally:
            del self._by_task[task]
            participant._done = True
            self._barrier.finished()
            waiters, participant._waiters = participant._waiters, []
            for waiter in waiters:
                self._wake(waiter, outcome.Value(None))
            self._check()

    def _release(self) -> None:
        """On close, break the scope's reference cycles so that reference counting frees
        it, its nursery and what its rounds carried as the request ends (otherwise each
        request leaves ~50 objects to the cyclic collector, whose passes then stall the
        loop): the batch names a stand-in that refuses calls, the host is forgotten (its
        task has left: ``run_inline`` refuses it anyway)."""
        self._host = None
        self.batch._scope = _ClosedScope(self._backends)

    async def _wait_participant(self, participant: Participant[Any]) -> None:
        if participant._done:
            await trio.lowlevel.checkpoint()
            return
        await self._block_on(participant._waiters)

    # ------------------------------------------------------------------ handles

    def _declare(self, command: Command) -> Handle[Any]:
        if self._closed:
            raise BatchClosed("the batch scope is closed")
        handle = Handle._create(command, self)
        self._pending.append(handle)
        return handle

    async def _wait_handle(self, handle: Handle[Any]) -> Any:
        if not handle._done:
            if self._host_alone():
                await self._flush_from_host()
            if not handle._done:
                await self._block_on(handle._waiters)
        else:
            # Resolved by a round already waited for: a cancel point, not a schedule point
            # (see Handle). A participant reading a round's N replies would otherwise give
            # up the CPU N - 1 times for nothing.
            await trio.lowlevel.checkpoint_if_cancelled()
        return handle.result()

    def _host_alone(self) -> bool:
        """Whether the calling task is the host and the only live participant, with a
        round to send and none in flight: the flush rule holds the moment it waits, and
        no one else can declare while the round is out."""
        host = self._host
        return (host is not None and self._barrier.live == 1 and bool(self._pending)
                and not self._flushing
                and self._by_task.get(trio.lowlevel.current_task()) is host)

    async def _flush_from_host(self) -> None:
        """Send the round from the host's own task, not a flush task: the spawn, the
        task's first schedule and the host's wake-up are not paid (a request whose checks
        all run inline waits so). Cancelled, it fails the round's handles, as a cancelled
        flush task would; the host being the only participant, nobody else waits on
        them. A checkpoint."""
        await trio.lowlevel.checkpoint_if_cancelled()
        handles, self._pending = self._pending, []
        self._flushing = True
        self._rounds += 1
        self._commands += len(handles)
        await self._flush(handles, self._rounds)

    async def _block_on(self, waiters: list[trio.lowlevel.Task]) -> None:
        """Park the current task on ``waiters``; count it as blocked if it participates."""
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        participant = self._by_task.get(task)
        waiters.append(task)
        if participant is not None:
            participant._blocked_on = waiters
            self._barrier.block()
        self._check()

        def abort(_: object) -> trio.lowlevel.Abort:
            waiters.remove(task)
            if participant is not None and participant._blocked_on is not None:
                participant._blocked_on = None
                self._barrier.unblock()
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _wake(self, task: trio.lowlevel.Task, result: outcome.Outcome[None]) -> None:
        """Reschedule a parked task, unblocking its participant *now*, not when it runs.

        Unblocking at wake-up matters: between now and the moment the task runs, the
        barrier must not believe it is still waiting, or a round could leave without the
        commands it is about to declare.
        """
        participant = self._by_task.get(task)
        if participant is not None and participant._blocked_on is not None:
            participant._blocked_on = None
            self._barrier.unblock()
        trio.lowlevel.reschedule(task, result)

    def _resolve(self, handle: Handle[Any], reply: object) -> None:
        for waiter in handle._set(reply):
            self._wake(waiter, outcome.Value(None))

    # ------------------------------------------------------------------ flushing

    def _check(self) -> None:
        """Start a round if the flush rule holds; break a dependency cycle if one formed."""
        pending = bool(self._pending)
        if self._barrier.ready(pending=pending, flushing=self._flushing):
            handles, self._pending = self._pending, []
            self._flushing = True
            self._rounds += 1
            self._commands += len(handles)
            # Without tasks (no nursery) the host is the only participant and sends its
            # rounds itself (_flush_from_host, and on exit): the rule cannot hold here.
            assert self._nursery is not None
            self._nursery.start_soon(self._flush, handles, self._rounds, name="batch flush")
        elif self._barrier.deadlocked(pending=pending, flushing=self._flushing):
            # Nothing pending or in flight: every blocked participant waits on another.
            error = RuntimeError("batch scope deadlock: participants wait on each other")
            for task, participant in list(self._by_task.items()):
                if participant._blocked_on is not None:
                    participant._blocked_on.remove(task)
                    self._wake(task, outcome.Error(error))

    async def _flush(self, handles: list[Handle[Any]], round_: int) -> None:
        commands = [h._command for h in handles]

        def deliver(i: int, reply: object) -> None:
            self._resolve(handles[i], reply)

        def sent(pipeline: PipelineSent) -> None:
            if self._tracer is not None:  # always, when passed; for mypy
                self._tracer.record(
                    FlushRecord(
                        trace_id=self._trace_id,
                        phase=self._phase,
                        round=round_,
                        backend=pipeline.backend,
                        commands=tuple(commands[i].label for i in pipeline.indices),
                        owners=tuple(commands[i].owner for i in pipeline.indices),
                        duration_s=pipeline.duration_s,
                        retry=pipeline.retry,
                        ok=pipeline.ok,
                    )
                )

        try:
            # No tracer: no record to build per pipeline.
            await send_round(commands, self._backends, deliver,
                             sent=sent if self._tracer is not None else None)
        finally:
            # Cancelled mid-flight: fail what was not delivered, so no handle dangles.
            for handle in handles:
                if not handle._done:
                    self._resolve(handle, BackendUnavailable("*", "flush cancelled"))
            self._flushing = False
            self._check()



@final
class _ClosedScope:
    """What a batch declares into once its scope has closed: the backends, to check a
    call as before, and a refusal."""

    __slots__ = ("_backends",)

    def __init__(self, backends: Mapping[str, Backend]) -> None:
        self._backends = backends

    def _declare(self, command: Command) -> NoReturn:
        raise BatchClosed("the batch scope is closed")


class Batch:
    """Where participants declare commands. Obtained as ``scope.batch``."""

    __slots__ = ("_scope",)

    _scope: BatchScope | _ClosedScope

    def __init__(self) -> None:
        raise TypeError("use open_batch_scope(...).batch")

    @classmethod
    def _create(cls, scope: BatchScope) -> Batch:
        self = object.__new__(cls)
        self._scope = scope
        return self

    def call(
        self,
        target: str | Script,
        *,
        keys: Iterable[Arg] = (),
        args: Iterable[Arg] = (),
        backend: str = "default",
        owner: str,
    ) -> Handle[Any]:
        """Declare a command (``"GET"``, ``"MGET"``, …) or a :class:`Script` call.

        Sync and never blocking: the command leaves with the next round. ``keys`` come
        first on the wire for plain commands (``SET k v`` is ``keys=[k], args=[v]``).

        Raises:
            BatchClosed: the scope has closed.
            ValueError: ``backend`` is not one of the scope's backends.
        """
        scope = self._scope
        return scope._declare(make_command(target, keys, args, backend, owner, scope._backends))


def open_batch_scope(
    backends: Mapping[str, Backend],
    *,
    tracer: Tracer | None = None,
    trace_id: str | None = None,
    phase: str = BEFORE,
    rounds_before: int = 0,
    host: bool = False,
    tasks: bool = True,
) -> AbstractAsyncContextManager[BatchScope]:
    """Open a batch scope: a nursery whose participants share flushes.

    Args:
        backends: backend name → backend. Names that map to the same object share one
            pipeline per round.
        tracer: receives a :class:`FlushRecord` per pipeline.
        trace_id: the request id the records carry (a counter if not given).
        phase: ``"before"`` or ``"after"`` the model call, for the records.
        rounds_before: rounds the same trace and phase already waited in an earlier
            scope; this scope's rounds are numbered after them (records, statistics).
        host: the body itself is a participant, live until it exits, and may run
            participants in its own task with :meth:`BatchScope.run_inline` (no task
            each). No round leaves while the body runs without waiting on the batch.
        tasks: False (with ``host=True`` only) opens no nursery: every participant runs
            inline, the host sends each round from its own task, and
            :meth:`BatchScope.start_participant` and :attr:`BatchScope.cancel_scope`
            refuse. What a nursery costs each request (its manager, its cancel scope, the
            schedule point of its exit) is not paid: admission runs so.

    On exit, waits for every participant; commands declared and never awaited still
    leave in a last round. Entering is not a checkpoint; exiting is (with
    ``tasks=False``, only when such a last round leaves).

    Raises:
        ValueError: ``tasks=False`` without ``host=True``.
    """
    if tasks:
        return _nursery_scope(backends, tracer, trace_id, phase, rounds_before, host)
    if not host:
        raise ValueError("a scope without tasks needs host=True (its body is the participant)")
    return _InlineScope(backends, tracer, trace_id or f"scope-{next(_trace_ids)}", phase,
                        rounds_before)


@final
class _InlineScope:
    """``open_batch_scope(..., host=True, tasks=False)``: a scope whose only task is its
    host's. A class, not a generator context manager: it is entered once per governed
    request, and the generator machinery would cost more than the body."""

    __slots__ = ("_scope",)

    def __init__(self, backends: Mapping[str, Backend], tracer: Tracer | None, trace_id: str,
                 phase: str, rounds_before: int) -> None:
        self._scope = BatchScope._create(None, backends, tracer, trace_id, phase,
                                         rounds_before)

    async def __aenter__(self) -> BatchScope:
        scope = self._scope
        scope._enter_host()
        return scope

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        scope = self._scope
        try:
            scope._leave_host()
            # Leftovers (declared, never awaited) leave as with a nursery, from this task;
            # not when the body raised (a nursery would have cancelled their flush).
            if exc_type is None and scope._pending:
                await scope._flush_from_host()
        finally:
            scope._closed = True
            scope._release()


@asynccontextmanager
async def _nursery_scope(
    backends: Mapping[str, Backend], tracer: Tracer | None, trace_id: str | None, phase: str,
    rounds_before: int, host: bool,
) -> AsyncIterator[BatchScope]:
    scope: BatchScope | None = None
    try:
        async with trio.open_nursery() as nursery:
            scope = BatchScope._create(
                nursery, backends, tracer, trace_id or f"scope-{next(_trace_ids)}", phase,
                rounds_before,
            )
            if host:
                scope._enter_host()
            try:
                yield scope
            except BaseException:
                scope._leave_host()
                raise
            scope._leave_host()
            # Leftovers (declared, never awaited) leave once the participants allow it;
            # the nursery's exit then waits for participants and flushes alike.
            scope._check()
    finally:
        if scope is not None:
            scope._closed = True
            scope._release()
