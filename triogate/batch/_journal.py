"""A local journal for post-call writes that could not reach their backend.

When a settler pipeline fails as a whole, or a command gets a *transient* error reply
(``LOADING``, ``READONLY``, ``OOM``...: see :attr:`CommandError.is_transient`), the
command goes here (JSON lines, one entry per batch and backend) and the settler replays
it, in chunks, when the backend answers again. Each process owns one journal file,
locked with ``flock`` for as long as it lives; a file whose lock can be taken belongs to
a process that died, and is claimed and replayed by the next process that starts in the
state folder.

What an entry holds (about 300 bytes per settlement script): the wall-clock time it was
written (epoch ms), and per command its name, keys, args, owner, a *replay window*, and
for a script its name and SHA, never its source. Replay sends ``EVALSHA``; a server that
does not know the SHA gets the script of that name from the settler's registry (only if
the SHA matches: a script that changed since is not run with old arguments).

Replay re-sends the commands. **Post-call commands must therefore be idempotent by
request id**: a pipeline that "failed" may have been applied before the connection
dropped, and a replay that fails half-way is replayed again. triogate's settlement
scripts guard every counter with a per-request marker, which expires: a command older
than its replay window (the marker's lifetime) is not replayed but dead-lettered
(``_deadletter.py``), since it could apply twice.

Memory and disk are bounded by ``max_bytes``: entries that do not fit are refused by
:meth:`Journal.append` (the settler dead-letters them) rather than growing without end.
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

#: Default bound on the journal (held in memory, mirrored on disk).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@final
@attrs.frozen(eq=False)
class JournalEntry:
    """The commands of one post-call batch for one backend.

    Attributes:
        trace_id: the request the writes belong to.
        backend: the backend name they go to.
        commands: the commands, in declaration order.
        written_ms: wall-clock time (epoch ms) the writes were first journaled.
        windows_ms: per command, how long after ``written_ms`` it may still be replayed
            (None: for ever). Empty means None for every command.
    """

    trace_id: str
    backend: str
    commands: tuple[Command, ...]
    written_ms: int = 0
    windows_ms: tuple[int | None, ...] = ()

    def window_ms(self, i: int) -> int | None:
        """The replay window of ``commands[i]``."""
        return self.windows_ms[i] if i < len(self.windows_ms) else None

    def subset(self, indices: Iterable[int]) -> JournalEntry:
        """The same entry with only ``commands[i]`` for ``i`` in ``indices``."""
        keep = list(indices)
        return JournalEntry(
            self.trace_id, self.backend, tuple(self.commands[i] for i in keep),
            self.written_ms, tuple(self.window_ms(i) for i in keep),
        )


def encode_arg(arg: Arg) -> Any:
    """An argument as JSON: bytes as ``{"b64": ...}`` (also used by dead letters)."""
    if isinstance(arg, bytes):
        try:
            return arg.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(arg).decode()}
    return arg


def _decode_arg(raw: Any) -> Arg:
    if isinstance(raw, dict):
        return base64.b64decode(raw["b64"])
    return raw  # type: ignore[no-any-return]


def encode_entry(entry: JournalEntry) -> bytes:
    """One JSON line for ``entry``: scripts by name and SHA, never by source."""
    commands = []
    for i, c in enumerate(entry.commands):
        item: dict[str, Any] = {
            "name": c.name,
            "keys": [encode_arg(k) for k in c.keys],
            "args": [encode_arg(a) for a in c.args],
            "owner": c.owner,
        }
        if c.script is not None:
            item["script"] = c.script.name
            item["sha"] = c.script.sha
        window = entry.window_ms(i)
        if window is not None:
            item["window_ms"] = window
        commands.append(item)
    line = {"v": 2, "ts_ms": entry.written_ms, "trace_id": entry.trace_id,
            "backend": entry.backend, "commands": commands}
    return orjson.dumps(line) + b"\n"


def decode_entry(line: bytes) -> JournalEntry:
    """The inverse of :func:`encode_entry` (also reads version-1 lines, which carried the
    script source and no time).

    A script comes back as a source-less :class:`Script` (name and SHA only) unless the
    line carried its source; the settler resolves it against its registry.
    """
    raw = orjson.loads(line)
    commands = []
    windows: list[int | None] = []
    for c in raw["commands"]:
        script = c.get("script")
        if isinstance(script, dict):  # version 1
            resolved: Script | None = Script.from_source(script["name"], script["source"])
        elif script is not None:
            resolved = Script(name=script, source=b"", sha=c["sha"])
        else:
            resolved = None
        commands.append(Command(
            name=c["name"],
            keys=tuple(_decode_arg(k) for k in c["keys"]),
            args=tuple(_decode_arg(a) for a in c["args"]),
            owner=c["owner"],
            backend=raw["backend"],
            script=resolved,
        ))
        windows.append(c.get("window_ms"))
    return JournalEntry(raw["trace_id"], raw["backend"], tuple(commands),
                        int(raw.get("ts_ms", 0)), tuple(windows))


@final
class Journal:
    """This process's journal file in ``folder``, plus orphans claimed from dead ones.

    Args:
        folder: where the files live (created on :meth:`open`).
        max_bytes: bound on the encoded size of the entries held (memory and file).

    File I/O runs in worker threads; only the settler task calls these methods.
    """

    def __init__(self, folder: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._folder = Path(folder)
        self._id = uuid.uuid4().hex[:12]
        self._lock_fd: int | None = None
        self._pending: list[JournalEntry] = []
        self._sizes: dict[int, int] = {}
        self._bytes = 0
        self._dirty = False
        self.max_bytes = max_bytes

    @property
    def pending(self) -> tuple[JournalEntry, ...]:
        """Entries waiting for replay, oldest first."""
        return tuple(self._pending)

    @property
    def size_bytes(self) -> int:
        """Encoded size of the entries held (what the file holds after a rewrite)."""
        return self._bytes

    @property
    def dirty(self) -> bool:
        """True while the file lacks entries held in memory (a write failed: disk full)."""
        return self._dirty

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
            # An orphan is claimed whole, even past max_bytes: refusing it would leave it
            # on disk for nobody. The bound applies to what this process adds.
            self._hold(entries)
            # Persist into our file before deleting theirs: a crash in between duplicates
            # entries (harmless: replay is idempotent), never loses them.
            self._rewrite_sync()
            data_path.unlink(missing_ok=True)
            lock_path.unlink(missing_ok=True)
            return len(entries)
        finally:
            os.close(fd)

    def _hold(self, entries: Iterable[tuple[JournalEntry, int]] | Iterable[JournalEntry]) -> None:
        for item in entries:
            entry, size = item if isinstance(item, tuple) else (item, len(encode_entry(item)))
            self._pending.append(entry)
            self._sizes[id(entry)] = size
            self._bytes += size

    async def append(self, entries: Iterable[JournalEntry]) -> list[JournalEntry]:
        """Add entries durably (written and fsynced before this returns).

        Returns:
            The entries refused because the journal would exceed ``max_bytes`` (the
            caller must record them elsewhere; nothing is dropped silently).
        """
        refused, data = self.stage(entries)
        if data:
            await trio.to_thread.run_sync(self.write_staged_sync, data)
        else:
            await trio.lowlevel.checkpoint()
        return refused

    def stage(self, entries: Iterable[JournalEntry]) -> tuple[list[JournalEntry], bytes]:
        """Hold entries in memory; return those refused (over ``max_bytes``) and the bytes
        to pass to :meth:`write_staged_sync` (in a worker thread) to make the rest durable."""
        accepted: list[tuple[JournalEntry, bytes]] = []
        refused: list[JournalEntry] = []
        room = self.max_bytes - self._bytes
        for entry in entries:
            line = encode_entry(entry)
            if len(line) > room:
                refused.append(entry)
                continue
            room -= len(line)
            accepted.append((entry, line))
        self._hold((e, len(line)) for e, line in accepted)
        return refused, b"".join(line for _, line in accepted)

    def write_staged_sync(self, data: bytes) -> None:
        """Append staged bytes and fsync (blocking: call from a worker thread).

        After a failed write (disk full) the file is rewritten whole instead, so that it
        holds again every entry kept in memory meanwhile.

        Raises:
            OSError: the write failed; the entries stay held in memory (and replayed).
        """
        if not data:
            return
        if self._dirty:
            self._rewrite_sync()
            return
        try:
            self._append_sync(data)
        except OSError:
            self._dirty = True
            raise

    def _append_sync(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    async def forget(
        self, done: Iterable[JournalEntry], *, remainders: Iterable[JournalEntry] = ()
    ) -> None:
        """Drop entries that were dealt with (applied or dead-lettered), keep
        ``remainders`` (the parts of them still to replay, first), and rewrite the file."""
        done_ids = {id(e) for e in done}
        kept = [e for e in self._pending if id(e) not in done_ids]
        for entry_id in done_ids:
            self._bytes -= self._sizes.pop(entry_id, 0)
        self._pending = []
        self._hold(remainders)
        self._pending.extend(kept)
        await trio.to_thread.run_sync(self._rewrite_sync)

    def _rewrite_sync(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                for start in range(0, len(self._pending), 1024):
                    f.write(b"".join(encode_entry(e)
                                     for e in self._pending[start:start + 1024]))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError:  # the next rewrite truncates what this one left in tmp
            self._dirty = True
            raise
        self._dirty = False

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
