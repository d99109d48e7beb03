"""Post-call batches and the settler that sends them with group commit.

After the model call, a request's writes (cache SET, spend, settlement, usage) collect in
a :class:`PostCallBatch`, opened with :func:`open_post_call_batch`. It closes when the
request's callbacks finish, or when its deadline (1 s by default) cancels them, and goes
to the :class:`Settler`, a task of the app nursery.

Group commit: the settler sends everything queued as one pipeline per backend. Batches
that close while a flush is in flight leave together in the next one, so under load
many requests share one network round trip. A pipeline that fails as a whole has its
batches journaled (``_journal.py``) and replayed once the backend answers again.
Shutdown calls :meth:`Settler.wait_drained` before cancelling the settler.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from ._errors import BackendUnavailable, BatchClosed, CommandError
from ._flush import send_round
from ._handle import Handle
from ._journal import JournalEntry
from ._scope import make_command
from ._tracer import AFTER, FlushRecord

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping

    from ._backend import Backend
    from ._command import Arg, Command
    from ._flush import PipelineSent
    from ._journal import Journal
    from ._scripts import Script
    from ._tracer import Tracer

logger = logging.getLogger("triogate.batch.settler")


@final
@attrs.frozen(kw_only=True)
class SettlerStatistics:
    """Counters of a settler since it started.

    Attributes:
        queued: closed batches waiting for the next flush.
        in_flight: batches in the flush under way.
        flushes: flushes sent (each is one round: a pipeline per backend, concurrently).
        pipelines: pipelines sent (a flush to two backends sends two).
        batches: batches settled, journaled or failed.
        commands: commands sent.
        journaled: batch-backend entries written to the journal.
        replayed: journal entries replayed successfully.
        journal_pending: journal entries still waiting for their backend.
    """

    queued: int
    in_flight: int
    flushes: int
    pipelines: int
    batches: int
    commands: int
    journaled: int
    replayed: int
    journal_pending: int


@final
class PostCallBatch:
    """The writes of one request after its model call. Made by :func:`open_post_call_batch`."""

    #: The request (or unit of work) these writes belong to, for traces and the journal.
    trace_id: str
    _settler: Settler
    _handles: list[Handle[Any]]
    _closed: bool
    _rounds: int
    _settled: trio.Event

    def __init__(self) -> None:
        raise TypeError("use open_post_call_batch")

    @classmethod
    def _create(cls, settler: Settler, trace_id: str) -> PostCallBatch:
        self = object.__new__(cls)
        self._settler = settler
        self.trace_id = trace_id
        self._handles = []
        self._closed = False
        self._rounds = 0
        self._settled = trio.Event()
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
        """Declare a write; it leaves when the batch closes. Sync; never blocks.

        The command must be idempotent by request id (see ``_journal.py``): it may be
        replayed after an outage.

        Raises:
            BatchClosed: the batch has closed.
            ValueError: unknown backend.
        """
        if self._closed:
            raise BatchClosed("the post-call batch is closed")
        command = make_command(target, keys, args, backend, owner, self._settler._backends)
        handle = Handle._create(command, self)
        self._handles.append(handle)
        return handle

    @property
    def rounds(self) -> int:
        """Flushes that carried this batch (1 normally; 0 if it declared nothing)."""
        return self._rounds

    @property
    def commands(self) -> tuple[Command, ...]:
        """What was declared so far."""
        return tuple(h.command for h in self._handles)

    async def wait_settled(self) -> None:
        """Wait until the settler has sent (or journaled) this batch."""
        await self._settled.wait()

    async def _wait_handle(self, handle: Handle[Any]) -> Any:
        if not handle._done:
            await self._settled.wait()
        else:
            await trio.lowlevel.checkpoint()
        return handle.result()


@asynccontextmanager
async def open_post_call_batch(
    settler: Settler, *, trace_id: str, deadline_s: float = 1.0, shield: bool = True
) -> AsyncIterator[PostCallBatch]:
    """Collect a request's post-call writes; hand them to ``settler`` on exit.

    The body (the request's success or failure callbacks) runs in a cancel scope with a
    deadline of ``deadline_s``: when it expires, the callbacks are cancelled and what was
    declared so far leaves anyway. With ``shield`` (the default), cancelling the request
    does not cancel its settlement; the deadline still bounds it. The hand-off is sync,
    so it happens even on error or cancellation. Exit is not a checkpoint.
    """
    batch = PostCallBatch._create(settler, trace_id)
    try:
        with trio.CancelScope(deadline=trio.current_time() + deadline_s, shield=shield):
            yield batch
    finally:
        batch._closed = True
        settler.submit_nowait(batch)


@final
class Settler:
    """Sends closed post-call batches with group commit; journals what cannot leave.

    Args:
        backends: backend name → backend, as for batch scopes.
        tracer: receives a record per trace and pipeline (phase ``"after"``).
        journal: where failed batches go; None to fail their handles instead.
        max_batches_per_flush: bound on one group commit.
        replay_interval_s: how often to retry journal replay while entries wait.
        on_settled: called (sync) with each batch once it is sent or journaled, e.g. to
            observe its waits in metrics.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        *,
        tracer: Tracer | None = None,
        journal: Journal | None = None,
        max_batches_per_flush: int = 1024,
        replay_interval_s: float = 1.0,
        on_settled: Callable[[PostCallBatch], None] | None = None,
    ) -> None:
        self._backends = backends
        self._on_settled = on_settled
        self._tracer = tracer
        self._journal = journal
        self._max_batches = max_batches_per_flush
        self._replay_interval_s = replay_interval_s
        self._queue: list[PostCallBatch] = []
        self._in_flight = 0
        self._wakeup = trio.Event()
        self._drained = trio.Event()
        self._drained.set()
        self._flushes = self._pipelines = self._batches = self._commands = 0
        self._journaled = self._replayed = 0

    def submit_nowait(self, batch: PostCallBatch) -> None:
        """Queue a closed batch for the next flush (sync; never blocks)."""
        if not batch._handles:
            batch._settled.set()
            return
        self._queue.append(batch)
        if self._drained.is_set():
            self._drained = trio.Event()
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush queued batches until cancelled; replay the journal while it has entries."""
        if self._journal is not None:
            await self._journal.open()
        task_status.started()
        try:
            while True:
                if self._queue:
                    batches = self._queue[: self._max_batches]
                    del self._queue[: self._max_batches]
                    await self._flush(batches)
                if self._journal_pending():
                    await self._replay()
                if self._queue:
                    continue
                self._drained.set()
                timeout = self._replay_interval_s if self._journal_pending() else float("inf")
                with trio.move_on_after(timeout):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
        finally:
            # Cancelled without a drain (a crash path): journal what is still queued
            # rather than lose it.
            if self._queue:
                queued, self._queue = self._queue, []
                with trio.CancelScope(shield=True):
                    await self._abandon(queued)
            if self._journal is not None:
                self._journal.close()
            self._drained.set()

    async def wait_drained(self) -> None:
        """Wait until every submitted batch has been sent, journaled or failed."""
        while self._queue or self._in_flight:
            await self._drained.wait()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> SettlerStatistics:
        """Counters (sync, cheap)."""
        return SettlerStatistics(
            queued=len(self._queue),
            in_flight=self._in_flight,
            flushes=self._flushes,
            pipelines=self._pipelines,
            batches=self._batches,
            commands=self._commands,
            journaled=self._journaled,
            replayed=self._replayed,
            journal_pending=len(self._journal.pending) if self._journal else 0,
        )

    def _journal_pending(self) -> bool:
        return self._journal is not None and bool(self._journal.pending)

    async def _flush(self, batches: list[PostCallBatch]) -> None:
        handles = [h for b in batches for h in b._handles]
        owners = [b for b in batches for _ in b._handles]
        commands = [h._command for h in handles]
        self._in_flight = len(batches)
        self._flushes += 1
        self._commands += len(commands)
        for batch in batches:
            batch._rounds += 1
        failed: list[int] = []

        def deliver(i: int, reply: object) -> None:
            handle = handles[i]
            if isinstance(reply, BackendUnavailable):
                failed.append(i)
            elif isinstance(reply, CommandError):
                logger.warning(
                    "post-call %s of %s failed: %s", commands[i].label, commands[i].owner,
                    reply.reply,
                )
            handle._set(reply)

        def sent(pipeline: PipelineSent) -> None:
            self._pipelines += 1
            if self._tracer is not None:
                self._trace(pipeline, owners, commands)

        try:
            await send_round(commands, self._backends, deliver, sent=sent)
        finally:
            undelivered = [i for i, h in enumerate(handles) if not h._done]
            for i in undelivered:
                handles[i]._set(BackendUnavailable("*", "settler cancelled"))
            failed.extend(undelivered)
            if failed:
                with trio.CancelScope(shield=True):
                    await self._journal_failed(failed, owners, commands)
            for batch in batches:
                batch._settled.set()
                if self._on_settled is not None:
                    self._on_settled(batch)
            self._batches += len(batches)
            self._in_flight = 0

    def _trace(
        self, pipeline: PipelineSent, owners: list[PostCallBatch], commands: list[Command]
    ) -> None:
        assert self._tracer is not None
        by_batch: dict[int, list[int]] = defaultdict(list)
        for i in pipeline.indices:
            by_batch[id(owners[i])].append(i)
        for indices in by_batch.values():
            batch = owners[indices[0]]
            self._tracer.record(
                FlushRecord(
                    trace_id=batch.trace_id,
                    phase=AFTER,
                    round=batch._rounds,
                    backend=pipeline.backend,
                    commands=tuple(commands[i].label for i in indices),
                    owners=tuple(commands[i].owner for i in indices),
                    duration_s=pipeline.duration_s,
                    shared_with=len(by_batch),
                    retry=pipeline.retry,
                    ok=pipeline.ok,
                )
            )

    async def _abandon(self, batches: list[PostCallBatch]) -> None:
        handles = [h for b in batches for h in b._handles]
        owners = [b for b in batches for _ in b._handles]
        for handle in handles:
            handle._set(BackendUnavailable("*", "settler stopped"))
        await self._journal_failed(
            list(range(len(handles))), owners, [h._command for h in handles]
        )
        for batch in batches:
            batch._settled.set()

    async def _journal_failed(
        self, failed: list[int], owners: list[PostCallBatch], commands: list[Command]
    ) -> None:
        if self._journal is None:
            logger.error("post-call writes lost: %d commands and no journal", len(failed))
            return
        grouped: dict[tuple[str, str], list[Command]] = defaultdict(list)
        for i in sorted(set(failed)):
            grouped[(owners[i].trace_id, commands[i].backend)].append(commands[i])
        entries = [JournalEntry(t, b, tuple(c)) for (t, b), c in grouped.items()]
        await self._journal.append(entries)
        self._journaled += len(entries)
        logger.warning("journaled %d post-call batches: backend unavailable", len(entries))

    async def _replay(self) -> None:
        """Re-send journaled entries; forget those whose pipeline got through."""
        assert self._journal is not None
        entries = [e for e in self._journal.pending if e.backend in self._backends]
        commands = [c for e in entries for c in e.commands]
        entry_of = [e for e in entries for _ in e.commands]
        lost: set[int] = set()

        def deliver(i: int, reply: object) -> None:
            if isinstance(reply, BackendUnavailable):
                lost.add(id(entry_of[i]))
            elif isinstance(reply, CommandError):
                logger.warning("replayed %s failed: %s", commands[i].label, reply.reply)

        await send_round(commands, self._backends, deliver)
        done = [e for e in entries if id(e) not in lost]
        if done:
            self._replayed += len(done)
            await self._journal.forget(done)
            logger.info("replayed %d journal entries", len(done))
