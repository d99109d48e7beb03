"""Dead letters: post-call writes that will never be applied automatically.

A post-call command lands here when replaying it could do harm or cannot help:

* its reply was a *permanent* error (a script error, ``WRONGTYPE``, a bad argument): the
  same command would fail the same way;
* it waited in the journal longer than its replay window (the idempotency marker that
  guards it may have expired, so a replay could apply it twice);
* its script is unknown to this process, or changed since it was journaled;
* the journal was full.

Each is one JSON line in a file of the state folder (``dead-letter.jsonl``), appended and
fsynced, shared by every process of that folder (``O_APPEND``, one ``write`` per batch of
lines), with its time, request id, backend, owner, command (scripts by name and SHA), keys,
arguments and the reason. Nothing reads the file back: it is for an operator, who
decides (see docs/architecture.md). The settler counts dead letters
and logs each with its owner.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, final

import attrs
import orjson
import trio

from ._journal import encode_arg

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._command import Command

logger = logging.getLogger("triogate.batch.deadletter")


@final
@attrs.frozen(kw_only=True)
class DeadLetter:
    """One command given up on, and why."""

    at_ms: int
    trace_id: str
    command: Command
    reason: str
    written_ms: int | None = None


def encode_letter(letter: DeadLetter) -> bytes:
    """One JSON line for ``letter``."""
    c = letter.command
    line = {
        "at_ms": letter.at_ms,
        "journaled_ms": letter.written_ms,
        "trace_id": letter.trace_id,
        "backend": c.backend,
        "owner": c.owner,
        "command": c.name,
        "script": None if c.script is None else c.script.name,
        "sha": None if c.script is None else c.script.sha,
        "keys": [encode_arg(k) for k in c.keys],
        "args": [encode_arg(a) for a in c.args],
        "reason": letter.reason,
    }
    return orjson.dumps(line) + b"\n"


@final
class DeadLetterFile:
    """Appends dead letters to ``path`` (created with its folder on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Append ``letters`` durably and log each (a checkpoint; runs in a thread)."""
        data = self.stage(letters)
        if data:
            await trio.to_thread.run_sync(self.write_staged_sync, data)
        else:
            await trio.lowlevel.checkpoint()

    def stage(self, letters: Sequence[DeadLetter]) -> bytes:
        """Log each letter (naming its owner); return the bytes for :meth:`write_staged_sync`."""
        for letter in letters:
            logger.error(
                "dead letter: %s of owner %r for request %s not applied: %s (see %s)",
                letter.command.label, letter.command.owner, letter.trace_id, letter.reason,
                self.path,
            )
        return b"".join(encode_letter(letter) for letter in letters)

    def write_staged_sync(self, data: bytes) -> None:
        """Append and fsync (blocking: call from a worker thread)."""
        if data:
            self._append_sync(data)

    def _append_sync(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
