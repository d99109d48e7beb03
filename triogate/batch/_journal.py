"""A local journal for post-call writes that could not reach their backend.

When a settler pipeline fails as a whole, the commands of every batch in it are
appended here (JSON lines, one entry per batch and backend) and the settler replays them
when the backend answers again. Each process owns one journal file, locked with
``flock`` for as long as it lives; a file whose lock can be taken belongs to a process
that died, and is claimed and replayed by the next process that starts in the state
folder.

Replay re-sends the commands. **Post-call commands must therefore be idempotent by
request id**: a pipeline that "failed" may have been applied before the connection
dropped, and a replay that fails half-way is replayed again. triogate's settlement
scripts guard every counter with a per-request marker in the same hash tag, so
replaying any entry any number of times changes no counter twice.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import attrs
import orjson
import trio

from ._command import Command
from ._scripts import Script

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._command import Arg

logger = logging.getLogger("triogate.batch.journal")


@final
@attrs.frozen
class JournalEntry:
    """The commands of one post-call batch for one backend."""

    trace_id: str
    backend: str
    commands: tuple[Command, ...]


def _encode_arg(arg: Arg) -> Any:
    if isinstance(arg, bytes):
        return {"b64": base64.b64encode(arg).decode()}
    return arg


def _decode_arg(raw: Any) -> Arg:
    if isinstance(raw, dict):
        return base64.b64decode(raw["b64"])
    return raw  # type: ignore[no-any-return]


def encode_entry(entry: JournalEntry) -> bytes:
    """One JSON line for ``entry`` (scripts carry their source: replay needs nothing else)."""
    commands = [
        {
            "name": c.name,
            "keys": [_encode_arg(k) for k in c.keys],
            "args": [_encode_arg(a) for a in c.args],
            "owner": c.owner,
            "script": None
            if c.script is None
            else {"name": c.script.name, "source": c.script.source.decode()},
        }
        for c in entry.commands
    ]
    line = {"trace_id": entry.trace_id, "backend": entry.backend, "commands": commands}
    return orjson.dumps(line) + b"\n"


def decode_entry(line: bytes) -> JournalEntry:
    """The inverse of :func:`encode_entry`."""
    raw = orjson.loads(line)
    commands = tuple(
        Command(
            name=c["name"],
            keys=tuple(_decode_arg(k) for k in c["keys"]),
            args=tuple(_decode_arg(a) for a in c["args"]),
            owner=c["owner"],
            backend=raw["backend"],
            script=None
            if c["script"] is None
            else Script.from_source(c["script"]["name"], c["script"]["source"]),
        )
        for c in raw["commands"]
    )
    return JournalEntry(trace_id=raw["trace_id"], backend=raw["backend"], commands=commands)


@final
class Journal:
    """This process's journal file in ``folder``, plus orphans claimed from dead ones.

    File I/O runs in worker threads; only the settler task calls these methods.
    """

    def __init__(self, folder: Path) -> None:
        self._folder = Path(folder)
        self._id = uuid.uuid4().hex[:12]
        self._lock_fd: int | None = None
        self._pending: list[JournalEntry] = []

    @property
    def pending(self) -> tuple[JournalEntry, ...]:
        """Entries waiting for replay, oldest first."""
        return tuple(self._pending)

    @property
    def path(self) -> Path:
        """This process's data file."""
        return self._folder / f"journal-{self._id}.jsonl"

    async def open(self) -> int:
        """Create the folder, lock this process's file, claim orphans; return entries claimed."""
        return await trio.to_thread.run_sync(self._open_sync)

    def _open_sync(self) -> int:
        self._folder.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._folder / f"journal-{self._id}.lock", os.O_CREAT | os.O_RDWR)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        claimed = 0
        for lock_path in sorted(self._folder.glob("journal-*.lock")):
            if lock_path.stem == f"journal-{self._id}":
                continue
            claimed += self._claim_sync(lock_path)
        if claimed:
            self._rewrite_sync()
            logger.warning("claimed %d journal entries from a previous process", claimed)
        return claimed

    def _claim_sync(self, lock_path: Path) -> int:
        fd = os.open(lock_path, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # its process is alive
            data_path = lock_path.with_suffix(".jsonl")
            entries = _read_entries(data_path)
            self._pending.extend(entries)
            # Persist into our file before deleting theirs: a crash in between duplicates
            # entries (harmless: replay is idempotent), never loses them.
            self._rewrite_sync()
            data_path.unlink(missing_ok=True)
            lock_path.unlink(missing_ok=True)
            return len(entries)
        finally:
            os.close(fd)

    async def append(self, entries: Iterable[JournalEntry]) -> None:
        """Add entries (durably: written and fsynced before this returns)."""
        new = list(entries)
        if not new:
            return
        self._pending.extend(new)
        data = b"".join(encode_entry(e) for e in new)
        await trio.to_thread.run_sync(self._append_sync, data)

    def _append_sync(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    async def forget(self, done: Iterable[JournalEntry]) -> None:
        """Drop replayed entries and rewrite the file with the rest."""
        done_ids = {id(e) for e in done}
        self._pending = [e for e in self._pending if id(e) not in done_ids]
        await trio.to_thread.run_sync(self._rewrite_sync)

    def _rewrite_sync(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(encode_entry(e) for e in self._pending))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Release the lock; the file stays if entries remain, for the next process."""
        if self._lock_fd is None:
            return
        lock_path = self._folder / f"journal-{self._id}.lock"
        if not self._pending:
            self.path.unlink(missing_ok=True)
            lock_path.unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def _read_entries(path: Path) -> list[JournalEntry]:
    if not path.exists():
        return []
    entries = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(decode_entry(line))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            # A torn last line from a crash mid-append: it was never acknowledged.
            logger.error("skipping unreadable journal line %d of %s", number, path)
    return entries
