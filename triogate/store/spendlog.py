"""The spend-log writer: one row per request, written to SQL in batches, never dropped.

Requests hand their row to :meth:`SpendLogWriter.submit_nowait` (sync, never blocks) and
move on. The writer's :meth:`~SpendLogWriter.run` task, in the app nursery, writes a
batch every ``interval_s`` or as soon as ``batch_rows`` are queued: one INSERT
transaction per batch, idempotent by request id (``ON CONFLICT DO NOTHING``).

Never dropped:

* A failed write (database down) keeps its rows at the head of the queue and is retried
  with exponential backoff; rows submitted meanwhile queue behind them.
* A batch the database refuses for its *data* (:class:`~triogate.store.StoreDataError`:
  a NUL byte in a PostgreSQL string, a number out of range; or a constraint) would fail
  the same way forever and hold every later row behind it. It is bisected: halves are
  written on their own until the rows that cannot be written are isolated; those go to
  ``dead-letter.jsonl`` in ``fallback_dir`` (same format as a spill file: fix them and
  rename the file ``spill-<anything>.jsonl`` to have them re-submitted) and the rest
  flows. Any other error (connection lost, database down, a missing table) is transient.
* Shutdown calls :meth:`~SpendLogWriter.wait_drained` (bounded by the grace period), then
  cancels ``run``. Rows still queued then are appended to a JSON-lines file in
  ``fallback_dir``, and the next writer that starts with the same folder re-submits them.
  Writing them twice is harmless: the insert skips request ids already present.

The fallback folder may be shared by several processes (one state folder, many
gateways). Each running writer holds an ``flock`` on ``writer-<id>.lock``; a spill file
(``spill-*.jsonl``) belongs to nobody until a starting writer claims it by renaming it to
``owned-<id>-*.jsonl`` (atomic: exactly one claimer wins). Owned files are deleted once
their rows are written, or once they are spilled again on exit; a writer that died
(its lock is free) leaves owned files that the next writer claims in turn.

Known limit: the queue is in memory and unbounded; during a long database outage it
grows with the request rate (about 1 KB a row).
"""

from __future__ import annotations

import collections
import fcntl
import itertools
import json
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, final

import attrs
import orjson
import trio

from triogate.errors import StoreError

from ._threads import StoreConflict, StoreDataError
from .records import SpendLogRow

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger("triogate.store.spendlog")

#: Rows the database refused for their data, in ``fallback_dir`` (spill-file format).
DEAD_LETTER_FILE = "dead-letter.jsonl"


class SpendLogSink(Protocol):
    """Where batches go: :class:`~triogate.store.queries.Store` (or a test double)."""

    async def insert_spend_logs(self, rows: Sequence[SpendLogRow]) -> int: ...


@final
@attrs.frozen(kw_only=True)
class SpendLogStatistics:
    """Counters of a writer since it was made.

    Attributes:
        queued: rows waiting to be written.
        written: rows in batches the database accepted (replays included).
        batches: INSERT transactions that succeeded.
        failures: INSERT attempts that failed (each retried).
        recovered: rows read back from the fallback folder at start.
        spilled: rows written to the fallback folder on exit.
        dead_lettered: rows the database refused for their data, set aside.
    """

    queued: int
    written: int
    batches: int
    failures: int
    recovered: int
    spilled: int
    dead_lettered: int


def encode_rows(rows: Sequence[SpendLogRow]) -> bytes:
    """JSON lines, one row each (any row: an integer beyond 64 bits, which orjson
    refuses, is written by the standard library)."""
    return b"".join(_encode_row(r) + b"\n" for r in rows)


def _encode_row(row: SpendLogRow) -> bytes:
    fields = attrs.asdict(row, recurse=False)
    try:
        return orjson.dumps(fields)
    except TypeError:
        return json.dumps(fields).encode()


def decode_rows(data: bytes, *, source: str = "?") -> list[SpendLogRow]:
    """The inverse of :func:`encode_rows`; unreadable lines are logged and skipped."""
    rows = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            # The standard library: orjson would read an integer beyond 64 bits as a float.
            raw = json.loads(line)
            raw["tags"] = tuple(raw.get("tags") or ())
            rows.append(SpendLogRow(**raw))
        except (ValueError, TypeError, AttributeError) as exc:
            logger.error("skipping unreadable spend-log line %d of %s: %s", number, source, exc)
    return rows


@final
class SpendLogWriter:
    """Batches spend-log rows into SQL; see the module docstring.

    Args:
        store: the sink (a :class:`~triogate.store.queries.Store`).
        interval_s: the longest a row waits before its batch is written.
        batch_rows: the most rows per INSERT; a full batch is written at once.
        fallback_dir: where rows still queued at exit are kept for the next writer;
            None = nowhere (they are logged as lost).
        min_backoff_s, max_backoff_s: retry delays after a failed write (doubling).
    """

    def __init__(
        self,
        store: SpendLogSink,
        *,
        interval_s: float = 1.0,
        batch_rows: int = 500,
        fallback_dir: Path | None = None,
        min_backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
    ) -> None:
        if interval_s <= 0 or batch_rows <= 0 or min_backoff_s <= 0:
            raise ValueError("interval_s, batch_rows and min_backoff_s must be positive")
        self._store = store
        self._interval_s = interval_s
        self._batch_rows = batch_rows
        self._fallback_dir = fallback_dir
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max(max_backoff_s, min_backoff_s)
        self._queue: collections.deque[SpendLogRow] = collections.deque()
        self._submitted = 0
        self._written = 0
        self._batches = 0
        self._failures = 0
        self._recovered = 0
        self._spilled = 0
        self._dead_lettered = 0
        # Written or set aside: rows leave the queue in order, so "everything submitted
        # before call X is done" is simply done >= submitted-at-X.
        self._done = 0
        self._drain_target = 0
        self._wake = trio.Event()
        self._progress = trio.Event()
        self._running = False

    # ------------------------------------------------------------------ producers

    def submit_nowait(self, row: SpendLogRow) -> None:
        """Queue a row for the next batch. Sync: never blocks, never fails."""
        self._queue.append(row)
        self._submitted += 1
        if len(self._queue) == 1 or len(self._queue) >= self._batch_rows:
            self._wake.set()

    async def wait_drained(self) -> None:
        """Wait until every row submitted before this call is written (or set aside as
        a dead letter); a checkpoint.

        Asks the writer to flush now rather than at the end of its interval. While the
        database is down this waits for it: bound it with the shutdown grace period.
        Returns early if the writer stops (cancelled: it spilled what was left).
        """
        target = self._submitted
        if self._done >= target:
            await trio.lowlevel.checkpoint()
            return
        self._drain_target = max(self._drain_target, target)
        self._wake.set()
        while self._done < target and self._running:
            await self._progress.wait()

    def statistics(self) -> SpendLogStatistics:
        """Counters since the writer was made."""
        return SpendLogStatistics(
            queued=len(self._queue),
            written=self._written,
            batches=self._batches,
            failures=self._failures,
            recovered=self._recovered,
            spilled=self._spilled,
            dead_lettered=self._dead_lettered,
        )

    # --------------------------------------------------------------------- the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches until cancelled; spill what is left to ``fallback_dir`` on exit.

        Reports started once rows left by a previous writer are queued again. Never
        returns on its own; cancel it after :meth:`wait_drained`.
        """
        if self._running:
            raise RuntimeError("this SpendLogWriter is already running")
        self._running = True
        folder: _FallbackFolder | None = None
        recovered_until = 0  # done >= this: the owned files' rows are all in SQL
        try:
            if self._fallback_dir is not None:
                folder = _FallbackFolder(self._fallback_dir)
                try:
                    rows = await trio.to_thread.run_sync(folder.open)
                except OSError:
                    logger.exception("spend-log fallback folder unusable; continuing without")
                    folder = None
                else:
                    for row in rows:
                        self.submit_nowait(row)
                    self._recovered += len(rows)
                    recovered_until = self._submitted
                    if rows:
                        logger.warning(
                            "re-submitting %d spend-log rows from %s", len(rows), self._fallback_dir
                        )
            task_status.started()
            while True:
                await self._wait_for_batch()
                await self._write_batch()
                if folder is not None and folder.owns_files and self._done >= recovered_until:
                    # Before waking drainers: once drained, no recovered file is left.
                    try:
                        await trio.to_thread.run_sync(folder.delete_owned)
                    except OSError:
                        # Harmless: the next writer re-submits them, and they are skipped.
                        logger.exception("could not delete recovered spend-log files")
                self._progress.set()
                self._progress = trio.Event()
        finally:
            with trio.CancelScope(shield=True):
                await self._spill(folder)
            self._running = False
            self._progress.set()  # wake drainers: nothing more will be written here

    async def _wait_wake(self) -> None:
        await self._wake.wait()
        self._wake = trio.Event()

    async def _wait_for_batch(self) -> None:
        while not self._queue:
            await self._wait_wake()
        with trio.move_on_after(self._interval_s):
            while len(self._queue) < self._batch_rows and self._done >= self._drain_target:
                await self._wait_wake()

    async def _write_batch(self) -> None:
        backoff_s = self._min_backoff_s
        while True:
            # Re-read each attempt: the head is unchanged, but the batch may have grown
            # (and a failed attempt may have written or set aside a prefix of it).
            batch = list(itertools.islice(self._queue, self._batch_rows))
            try:
                await self._write_or_isolate(batch)
            except StoreError as exc:
                self._failures += 1
                logger.warning(
                    "spend-log batch of %d rows not written (%s); retry in %.2f s",
                    len(batch),
                    exc,
                    backoff_s,
                )
                await trio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, self._max_backoff_s)
                continue
            return

    async def _write_or_isolate(self, rows: list[SpendLogRow]) -> None:
        """Write ``rows`` (the head of the queue); if the database refuses their data,
        bisect until the refused rows are alone, and set those aside.

        Raises:
            StoreError: a transient failure; what was done before it is off the queue.
        """
        try:
            await self._store.insert_spend_logs(rows)
        except (StoreDataError, StoreConflict) as exc:
            self._failures += 1
            if len(rows) > 1:
                middle = len(rows) // 2
                await self._write_or_isolate(rows[:middle])
                await self._write_or_isolate(rows[middle:])
                return
            await self._dead_letter(rows[0], exc)
            self._dead_lettered += 1
            self._pop(1)
            return
        # No checkpoint between the insert's return and this bookkeeping, so a
        # cancellation cannot leave written rows queued (they would only be written
        # twice, harmlessly, but the counts would lie).
        self._pop(len(rows))
        self._written += len(rows)
        self._batches += 1

    def _pop(self, count: int) -> None:
        for _ in range(count):
            self._queue.popleft()
        self._done += count

    async def _dead_letter(self, row: SpendLogRow, exc: StoreError) -> None:
        logger.error(
            "spend-log row %s refused by the database (%s); set aside in %s",
            row.request_id,
            exc,
            self._fallback_dir / DEAD_LETTER_FILE if self._fallback_dir else "nowhere (lost)",
        )
        if self._fallback_dir is None:
            return
        try:
            with trio.CancelScope(shield=True):  # a row is either set aside or still queued
                await trio.to_thread.run_sync(
                    _append_durably, self._fallback_dir / DEAD_LETTER_FILE, encode_rows([row])
                )
        except OSError:
            logger.exception("could not set aside spend-log row %s: it is lost", row.request_id)

    async def _spill(self, folder: _FallbackFolder | None) -> None:
        rows = list(self._queue)
        if folder is None:
            if rows:
                logger.error(
                    "spend-log writer stopped with %d rows unwritten and no "
                    "fallback folder: they are lost",
                    len(rows),
                )
            return
        try:
            await trio.to_thread.run_sync(folder.close, rows)
        except OSError:
            logger.exception(
                "could not spill %d spend-log rows to %s", len(rows), self._fallback_dir
            )
            return
        self._spilled += len(rows)
        self._queue.clear()
        if rows:
            logger.warning(
                "spilled %d unwritten spend-log rows to %s", len(rows), self._fallback_dir
            )


@final
class _FallbackFolder:
    """The files of one writer in the fallback folder (blocking: call from threads)."""

    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder)
        self._id = uuid.uuid4().hex[:16]
        self._lock_fd: int | None = None
        self._owned: list[Path] = []
        self._next = itertools.count()

    @property
    def owns_files(self) -> bool:
        return bool(self._owned)

    def _lock_path(self, writer_id: str) -> Path:
        return self._folder / f"writer-{writer_id}.lock"

    def _take(self, path: Path) -> bool:
        target = self._folder / f"owned-{self._id}-{next(self._next)}.jsonl"
        try:
            os.rename(path, target)  # atomic: if another writer took it first, ENOENT
        except FileNotFoundError:
            return False
        self._owned.append(target)
        return True

    def _is_dead(self, writer_id: str) -> bool:
        try:
            fd = os.open(self._lock_path(writer_id), os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its writer is alive
        finally:
            os.close(fd)  # closing releases a lock we took
        return True

    def open(self) -> list[SpendLogRow]:
        """Lock our id, claim unowned spill files and dead writers' files; read them."""
        self._folder.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._lock_path(self._id), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            return self._claim()
        except OSError:
            self._release()  # what we claimed stays on disk, for the next writer
            raise

    def _claim(self) -> list[SpendLogRow]:
        for path in sorted(self._folder.glob("spill-*.jsonl")):
            self._take(path)
        dead: set[str] = set()
        for path in sorted(self._folder.glob("owned-*.jsonl")):
            owner = path.name.split("-")[1]
            if owner != self._id and (owner in dead or self._is_dead(owner)):
                dead.add(owner)
                self._take(path)
        for owner in dead:
            self._lock_path(owner).unlink(missing_ok=True)
        rows: list[SpendLogRow] = []
        for path in self._owned:
            rows.extend(decode_rows(path.read_bytes(), source=str(path)))
        return rows

    def _release(self) -> None:
        if self._lock_fd is not None:
            self._lock_path(self._id).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    def delete_owned(self) -> None:
        """Forget claimed files: their rows are in SQL (or in a newer spill file)."""
        for path in self._owned:
            path.unlink(missing_ok=True)
        self._owned.clear()

    def close(self, rows: Sequence[SpendLogRow]) -> None:
        """Spill ``rows`` to a new file (durably), drop owned files, release the lock."""
        if rows:
            name = f"spill-{self._id}-{uuid.uuid4().hex[:8]}"
            tmp = self._folder / f".{name}.tmp"
            with open(tmp, "wb") as f:
                f.write(encode_rows(rows))
                f.flush()
                os.fsync(f.fileno())
            # Complete before visible: a starting writer never claims a partial file.
            os.rename(tmp, self._folder / f"{name}.jsonl")
            _fsync_dir(self._folder)
        # Only after the spill is durable: a crash in between duplicates rows, never
        # loses them.
        self.delete_owned()
        self._release()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` in one write (O_APPEND: processes sharing the folder interleave
    whole rows), then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
