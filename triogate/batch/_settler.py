"""Post-call batches and the settler that sends them with group commit.

After the model call, a request's writes (cache SET, spend, settlement, usage) collect in
a :class:`PostCallBatch`, opened with :func:`open_post_call_batch`. It closes when the
request's callbacks finish, or when its deadline (1 s by default) cancels them, and goes
to the :class:`Settler`, a task of the app nursery.

Group commit: the settler sends everything queued as one pipeline per backend. Batches
that close while a flush is in flight leave together in the next one, so under load
many requests share one network round trip.

What happens to a write that does not land, by its reply:

* the pipeline failed (refused, reset, timed out) or a *transient* error reply
  (``LOADING``, ``READONLY``, ``OOM``, ``BUSY``, ``TRYAGAIN``, ``CLUSTERDOWN``,
  ``MASTERDOWN``, ``NOREPLICAS``): journaled (``_journal.py``) and replayed, in chunks,
  until it is applied (``_replay.py``);
* a permanent error reply: a dead letter (``_deadletter.py``), logged with its owner;
* a write declared with ``journal=False`` (a cache SET: losing it costs a cache miss) is
  neither: it is logged and dropped.

Shutdown calls :meth:`Settler.wait_drained` before cancelling the settler.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from ._deadletter import DeadLetter
from ._errors import BackendUnavailable, BatchClosed, CommandError
from ._handle import SETTLED, Handle
from ._journal import JournalEntry
from ._merge import merge_table, send_merged
from ._replay import replay_pass
from ._scope import make_command
from ._tracer import AFTER, FlushRecord

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping

    from ._backend import Backend
    from ._command import Arg, Command
    from ._deadletter import DeadLetterFile
    from ._flush import PipelineSent
    from ._journal import Journal
    from ._merge import Merge
    from ._scripts import Script
    from ._tracer import Tracer

logger = logging.getLogger("triogate.batch.settler")

#: While ``busy()`` says so at the end of the group-commit delay, the flush waits on in
#: steps of this fraction of the delay...
BUSY_STEP = 0.5
#: ...up to this many delays after its oldest batch was queued.
BUSY_MAX_DELAYS = 4

#: Bound on every shielded wait of the settler (journal and dead-letter writes at the end
#: of a flush or on cancellation): a hung disk must not hang shutdown.
SHIELD_TIMEOUT_S = 5.0


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
        journal_bytes: encoded size of those entries.
        dead_lettered: commands written to the dead-letter file.
        retried: commands journaled for a transient error reply (not a failed pipeline).
        disk_errors: journal or dead-letter writes that failed (disk full, I/O error).
        disk_ok: False while the last such write failed: what the journal holds is in
            memory only (kept, and replayed, but lost if the process dies).
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
    journal_bytes: int
    dead_lettered: int
    retried: int
    disk_errors: int = 0
    disk_ok: bool = True


@final
class PostCallBatch:
    """The writes of one request after its model call. Made by :func:`open_post_call_batch`."""

    #: The request (or unit of work) these writes belong to, for traces and the journal.
    trace_id: str
    _settler: Settler
    _handles: list[Handle[Any]]
    _replay: list[tuple[bool, int | None]]
    _closed: bool
    _rounds: int
    _settled: trio.Event
    _urgent: bool

    def __init__(self) -> None:
        raise TypeError("use open_post_call_batch")

    @classmethod
    def _create(cls, settler: Settler, trace_id: str) -> PostCallBatch:
        self = object.__new__(cls)
        self._settler = settler
        self.trace_id = trace_id
        self._handles = []
        self._replay = []
        self._closed = False
        self._rounds = 0
        self._settled = trio.Event()
        self._urgent = False
        return self

    def hurry(self) -> None:
        """Let this batch leave without the settler's group-commit delay (it takes the
        batches queued before it along): for a write the client's next request may
        depend on at once, such as the release of a parallel slot. Sync."""
        self._urgent = True

    def call(
        self,
        target: str | Script,
        *,
        keys: Iterable[Arg] = (),
        args: Iterable[Arg] = (),
        backend: str = "default",
        owner: str,
        journal: bool = True,
        replay_window_ms: int | None = None,
    ) -> Handle[Any]:
        """Declare a write; it leaves when the batch closes. Sync; never blocks.

        The command must be idempotent by request id (see ``_journal.py``): it may be
        replayed after an outage.

        Args:
            journal: False for a write not worth keeping when it cannot land (a cache
                SET): it is never journaled nor dead-lettered.
            replay_window_ms: how long after it was journaled the write may still be
                replayed (the lifetime of the marker that makes it idempotent); older, it
                is dead-lettered instead. None: no limit.

        Raises:
            BatchClosed: the batch has closed.
            ValueError: unknown backend.
        """
        if self._closed:
            raise BatchClosed("the post-call batch is closed")
        command = make_command(target, keys, args, backend, owner, self._settler._backends)
        handle = Handle._create(command, self)
        self._handles.append(handle)
        self._replay.append((journal, replay_window_ms))
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
    does not cancel its settlement; the deadline still bounds it (a shield always has
    one). The hand-off is sync,
    so it happens even on error or cancellation. Exit is not a checkpoint.
    """
    batch = PostCallBatch._create(settler, trace_id)
    try:
        with trio.CancelScope(deadline=trio.current_time() + deadline_s, shield=shield):
            yield batch
    finally:
        batch._closed = True
        settler.submit_nowait(batch)


def post_call_batch(settler: Settler, *, trace_id: str) -> PostCallWrites:
    """:func:`open_post_call_batch` for callbacks that do not wait: a sync ``with``.

    ``with post_call_batch(settler, trace_id=...) as post:`` collects the writes declared
    in the body and hands them to ``settler`` on exit (even on error), as the async form
    does, without its async generator and deadline scope (~20 µs a request). Nothing
    bounds the body: use it only where the body declares and never awaits (a body
    without checkpoints cannot be cancelled either, so the shield is moot).
    """
    return PostCallWrites(PostCallBatch._create(settler, trace_id))


@final
class PostCallWrites:
    """The sync context manager :func:`post_call_batch` returns."""

    __slots__ = ("_batch",)

    def __init__(self, batch: PostCallBatch) -> None:
        self._batch = batch

    def __enter__(self) -> PostCallBatch:
        return self._batch

    def __exit__(self, *exc_info: object) -> None:
        batch = self._batch
        batch._closed = True
        batch._settler.submit_nowait(batch)


def _release(batch: PostCallBatch) -> None:
    """Break the batch's reference cycle with its handles once they are all resolved
    (see ``_handle._Settled``): awaiting one still gives its result."""
    for handle in batch._handles:
        handle._source = SETTLED


@final
class Settler:
    """Sends closed post-call batches with group commit; journals what cannot leave.

    Args:
        backends: backend name → backend, as for batch scopes.
        tracer: receives a record per trace and pipeline (phase ``"after"``).
        journal: where failed batches go; None to fail their handles instead.
        dead_letters: where writes given up on go; None to log them only.
        scripts: the registry, by name: a journaled script comes back as a name and a
            SHA, and is EVALed from here when the server does not know it.
        max_batches_per_flush: bound on one group commit.
        max_commands_per_flush: bound on the commands of one group commit (a flush takes
            at least one batch). Under load thousands of batches queue; one pipeline of
            all their writes holds the server for its whole run, and fused into one
            script call (``_fusion.py``) its header outgrew Lua's stack ("string slice
            too long"): every write in it was dead-lettered.
        replay_interval_s: how often to retry journal replay while entries wait.
        replay_chunk_commands: about how many commands one replay round carries.
        replay_max_chunks: chunks per replay pass (new flushes go between passes).
        on_settled: called (sync) with each batch once it is sent or journaled, e.g. to
            observe its waits in metrics.
        clock_ms: wall clock (epoch ms) for journal and dead-letter times.
        merges: scripts whose calls with the same keys leave a flush as one merged call
            (``_merge.py``); each owner still gets its own reply, and the journal its
            own call.
        delay_s: group-commit delay: a flush leaves this long after the oldest batch it
            carries was queued (at once when ``max_batches_per_flush`` batches wait, or
            when :meth:`wait_drained` is waiting). A request's writes close as its
            response leaves; with one client, its next request's pre-call work follows
            at once, and a flush sent then competes with it for the loop and the
            Redis connection. A few milliseconds later the next request waits for its
            upstream and the flush costs it nothing; more requests share each flush too.
            0: at once.
        busy: with ``delay_s``, says whether latency-critical work is under way (e.g.
            requests in their pre-call checks); while it is, a due flush waits on in
            steps of ``BUSY_STEP`` delays, up to ``BUSY_MAX_DELAYS`` delays in all. On a
            loaded host a request's pre-call work can outlast the delay, and a flush
            sent then delays it as much as one sent at once.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        *,
        tracer: Tracer | None = None,
        journal: Journal | None = None,
        dead_letters: DeadLetterFile | None = None,
        scripts: Iterable[Script] = (),
        max_batches_per_flush: int = 1024,
        max_commands_per_flush: int = 1024,
        replay_interval_s: float = 1.0,
        replay_chunk_commands: int = 256,
        replay_max_chunks: int = 16,
        on_settled: Callable[[PostCallBatch], None] | None = None,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        merges: Iterable[Merge] = (),
        delay_s: float = 0.0,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, not {delay_s}")
        self._delay_s = delay_s
        self._busy = busy
        self._queued_at = 0.0  # when the oldest queued batch was queued
        self._hurry = trio.Event()  # set: the delay is cut short (drain, full queue)
        self._merges = merge_table(merges)
        self._backends = backends
        self._dead_letters = dead_letters
        self._scripts = {s.name: s for s in scripts}
        self._chunk_commands = replay_chunk_commands
        self._max_chunks = replay_max_chunks
        self._clock_ms = clock_ms
        self._next_replay = 0.0
        self._on_settled = on_settled
        self._tracer = tracer
        self._journal = journal
        self._max_batches = max_batches_per_flush
        self._max_commands = max_commands_per_flush
        self._replay_interval_s = replay_interval_s
        self._queue: list[PostCallBatch] = []
        self._draining = 0  # wait_drained callers: no delay while any waits
        self._in_flight = 0
        self._wakeup = trio.Event()
        #: The settler's idle wait while it has nothing queued (with a delay only): a
        #: first batch moves its deadline to the end of the delay instead of waking it.
        self._idle: trio.CancelScope | None = None
        self._drained = trio.Event()
        self._drained.set()
        self._flushes = self._pipelines = self._batches = self._commands = 0
        self._journaled = self._replayed = self._dead = self._retried = 0
        self._disk_errors = 0
        self._disk_ok = True

    def submit_nowait(self, batch: PostCallBatch) -> None:
        """Queue a closed batch for the next flush (sync; never blocks)."""
        if not batch._handles:
            batch._settled.set()
            return
        if not self._queue:
            # The first batch since the last flush started: the delay counts from now
            # (the settler waits on _hurry only while the queue is not empty).
            self._queued_at = trio.current_time()
            if self._hurry.is_set() and not self._draining:
                self._hurry = trio.Event()
        self._queue.append(batch)
        if batch._urgent or len(self._queue) >= self._max_batches:
            self._hurry.set()
        if self._drained.is_set():
            self._drained = trio.Event()
        idle = self._idle
        if idle is not None and not self._hurry.is_set():
            # Woken now, the settler would only start the delay and sleep again: a loop
            # pass (at one connection, one per request) for nothing. It wakes when the
            # delay is over instead, and flushes.
            idle.deadline = min(idle.deadline, self._queued_at + self._delay_s)
        else:
            self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush queued batches until cancelled; replay the journal while it has entries."""
        if self._journal is not None:
            await self._journal.open()
        task_status.started()
        try:
            while True:
                if self._queue and self._delay_s and not self._hurry.is_set():
                    await self._wait_delay()
                if self._queue:
                    batches = self._take()
                    if self._queue:  # over one flush's bounds: the rest leaves next
                        self._hurry.set()
                    await self._flush(batches)
                # Replay at most every replay_interval_s while it makes no progress (a
                # down backend must not cost every flush a second timeout), at once
                # while it does (a long journal goes chunk by chunk, flushes between).
                now = trio.current_time()
                if self._journal_pending() and now >= self._next_replay:
                    progressed = await self._replay()
                    self._next_replay = now + (0 if progressed else self._replay_interval_s)
                if self._queue:
                    continue
                self._drained.set()
                timeout = (max(0.0, self._next_replay - trio.current_time())
                           if self._journal_pending() else float("inf"))
                with trio.move_on_after(timeout) as idle:
                    if self._delay_s:
                        self._idle = idle
                    try:
                        await self._wakeup.wait()
                    finally:
                        self._idle = None
                self._wakeup = trio.Event()
        finally:
            # Cancelled without a drain (a crash path): journal what is still queued
            # rather than lose it.
            if self._queue:
                queued, self._queue = self._queue, []
                with trio.move_on_after(SHIELD_TIMEOUT_S, shield=True) as cs:
                    await self._abandon(queued)
                if cs.cancelled_caught:
                    logger.error("journaling %d queued batches took over %s s",
                                 len(queued), SHIELD_TIMEOUT_S)
            if self._journal is not None:
                self._journal.close()
            self._drained.set()

    async def _wait_delay(self) -> None:
        """The group-commit delay, longer while ``busy()`` (bounded); cut short by
        ``_hurry``."""
        due = self._queued_at + self._delay_s
        limit = self._queued_at + self._delay_s * BUSY_MAX_DELAYS
        while True:
            if trio.current_time() < due:  # not when woken at the due time (submit_nowait)
                with trio.move_on_at(due):
                    await self._hurry.wait()
            if self._hurry.is_set() or self._busy is None or due >= limit:
                return
            if not self._busy():
                return
            due = min(limit, trio.current_time() + self._delay_s * BUSY_STEP)

    def _take(self) -> list[PostCallBatch]:
        """The next group commit: queued batches in order, within both bounds."""
        queue = self._queue
        count = commands = 0
        for batch in queue[: self._max_batches]:
            commands += len(batch._handles)
            if count and commands > self._max_commands:
                break
            count += 1
        taken = queue[:count]
        del queue[:count]
        return taken

    async def wait_drained(self) -> None:
        """Wait until every submitted batch has been sent, journaled or failed."""
        self._draining += 1
        self._hurry.set()  # what is queued leaves now, not after the delay
        self._wakeup.set()  # the settler may be asleep until the delay is over
        try:
            while self._queue or self._in_flight:
                await self._drained.wait()
        finally:
            self._draining -= 1
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
            journal_bytes=self._journal.size_bytes if self._journal else 0,
            dead_lettered=self._dead,
            retried=self._retried,
            disk_errors=self._disk_errors,
            disk_ok=self._disk_ok,
        )

    def _journal_pending(self) -> bool:
        return self._journal is not None and bool(self._journal.pending)

    async def _flush(self, batches: list[PostCallBatch]) -> None:
        handles = [h for b in batches for h in b._handles]
        owners = [b for b in batches for _ in b._handles]
        commands = [h._command for h in handles]
        policies = [p for b in batches for p in b._replay]
        self._in_flight = len(batches)
        self._flushes += 1
        self._commands += len(commands)
        for batch in batches:
            batch._rounds += 1
        failed: list[int] = []
        dead: list[DeadLetter] = []

        def deliver(i: int, reply: object) -> None:
            handle = handles[i]
            if isinstance(reply, BackendUnavailable):
                failed.append(i)
            elif isinstance(reply, CommandError) and reply.is_transient:
                failed.append(i)
                self._retried += policies[i][0]
            elif isinstance(reply, CommandError):
                if policies[i][0]:
                    dead.append(DeadLetter(at_ms=self._clock_ms(), trace_id=owners[i].trace_id,
                                           command=commands[i], reason=reply.reply))
                else:
                    logger.warning("post-call %s of %s failed: %s", commands[i].label,
                                   commands[i].owner, reply.reply)
            handle._set(reply)

        def sent(pipeline: PipelineSent) -> None:
            self._pipelines += 1
            if self._tracer is not None:
                self._trace(pipeline, owners, commands)

        try:
            alone = await send_merged(commands, self._backends, deliver,
                                      merges=self._merges, sent=sent)
            if alone:
                logger.warning("%d post-call writes sent alone: their merged call failed",
                               alone)
        finally:
            undelivered = [i for i, h in enumerate(handles) if not h._done]
            for i in undelivered:
                handles[i]._set(BackendUnavailable("*", "settler cancelled"))
            failed.extend(undelivered)
            if failed:
                # The backend just failed or refused: the next replay waits an interval.
                self._next_replay = trio.current_time() + self._replay_interval_s
            if failed or dead:
                with trio.move_on_after(SHIELD_TIMEOUT_S, shield=True) as cs:
                    await self._journal_failed(failed, owners, commands, policies, dead)
                if cs.cancelled_caught:
                    logger.error("journal or dead-letter write took over %s s",
                                 SHIELD_TIMEOUT_S)
            for batch in batches:
                _release(batch)
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
            list(range(len(handles))), owners, [h._command for h in handles],
            [p for b in batches for p in b._replay],
        )
        for batch in batches:
            _release(batch)
            batch._settled.set()

    async def _journal_failed(
        self,
        failed: list[int],
        owners: list[PostCallBatch],
        commands: list[Command],
        policies: list[tuple[bool, int | None]],
        dead: list[DeadLetter] | None = None,
    ) -> None:
        """Journal the durable ``failed`` commands and write ``dead``, in one thread job."""
        letters = list(dead or ())
        durable = [i for i in sorted(set(failed)) if policies[i][0]]
        if len(durable) < len(set(failed)):
            logger.info("dropped %d post-call writes not worth journaling (cache)",
                        len(set(failed)) - len(durable))
        journal_data = b""
        if durable and self._journal is None:
            logger.error("post-call writes lost: %d commands and no journal", len(durable))
        elif durable and self._journal is not None:
            grouped: dict[tuple[str, str], list[int]] = defaultdict(list)
            for i in durable:
                grouped[(owners[i].trace_id, commands[i].backend)].append(i)
            now_ms = self._clock_ms()
            entries = [
                JournalEntry(t, b, tuple(commands[i] for i in ix), now_ms,
                             tuple(policies[i][1] for i in ix))
                for (t, b), ix in grouped.items()
            ]
            refused, journal_data = self._journal.stage(entries)
            self._journaled += len(entries) - len(refused)
            letters += [
                DeadLetter(at_ms=now_ms, trace_id=e.trace_id, command=c, written_ms=now_ms,
                           reason=f"journal full ({self._journal.max_bytes} bytes)")
                for e in refused for c in e.commands
            ]
            logger.warning("journaled %d post-call batches: backend unavailable or busy",
                           len(entries) - len(refused))
        await self._persist(journal_data, letters)

    async def _write_dead(self, letters: list[DeadLetter]) -> None:
        await self._persist(b"", letters)

    async def _persist(self, journal_data: bytes, letters: list[DeadLetter]) -> None:
        """Make journal bytes and dead letters durable in one worker-thread job.

        The job is abandoned, not interrupted, when a deadline cancels the wait: once
        started it finishes its writes whatever happens to the waiter, so a shield's
        deadline bounds the wait without losing the write.
        """
        self._dead += len(letters)
        dead_data = b""
        if letters and self._dead_letters is None:
            for letter in letters:
                logger.error("post-call %s of %r for %s given up: %s", letter.command.label,
                             letter.command.owner, letter.trace_id, letter.reason)
        elif letters and self._dead_letters is not None:
            dead_data = self._dead_letters.stage(letters)
        if not journal_data and not dead_data:
            return
        journal, dead_file = self._journal, self._dead_letters

        def write() -> list[tuple[str, OSError]]:
            failed: list[tuple[str, OSError]] = []
            if journal_data and journal is not None:
                try:
                    journal.write_staged_sync(journal_data)
                except OSError as exc:  # kept in memory; the next write rewrites it all
                    failed.append(("journal", exc))
            if dead_data and dead_file is not None:
                try:
                    dead_file.write_staged_sync(dead_data)
                except OSError as exc:  # each letter was logged when staged
                    failed.append(("dead-letter file", exc))
            return failed

        self._disk_written(await trio.to_thread.run_sync(write, abandon_on_cancel=True))

    def _disk_written(self, failed: list[tuple[str, OSError]]) -> None:
        """Count a write of the journal or dead letters: a failure (disk full) degrades,
        never stops the settler (it would take the gateway down with it)."""
        for what, exc in failed:
            self._disk_errors += 1
            logger.error("could not write the %s (%s): what it holds is kept in memory "
                         "and retried; free disk space", what,
                         errno.errorcode.get(exc.errno or 0, type(exc).__name__))
        self._disk_ok = not failed and not (self._journal is not None and self._journal.dirty)

    async def _replay(self) -> bool:
        """One replay pass (``_replay.py``): forget what landed, dead-letter what never will.

        Returns whether the pass settled anything and its backend kept answering (so
        another pass may follow at once).
        """
        assert self._journal is not None
        result = await replay_pass(
            self._journal, self._backends, self._scripts, now_ms=self._clock_ms(),
            chunk_commands=self._chunk_commands, max_chunks=self._max_chunks,
        )
        self._replayed += result.entries_done
        await self._write_dead(result.dead)
        if result.done:
            try:
                await self._journal.forget(result.done, remainders=result.remainders)
            except OSError as exc:
                self._disk_written([("journal", exc)])
            else:
                self._disk_written([])
        if result.entries_done:
            logger.info("replayed %d journal entries (%d commands applied)",
                        result.entries_done, result.applied)
        return not result.stopped and (result.applied > 0 or bool(result.dead))
