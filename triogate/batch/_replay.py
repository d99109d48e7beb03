"""Journal replay: in chunks, scripts by SHA, and a verdict per command.

Each pass sends the journal's entries in chunks of about ``chunk_commands`` commands, one
round per chunk, and stops at the first chunk whose backend did not answer (it is down:
the rest waits for the next pass). Per command, the verdict is:

* **applied**: any reply but an error (a settlement script that finds its marker answers
  "already applied", which is applied too): forgotten;
* **not yet**: the pipeline failed, or a transient error reply (``LOADING``...): kept;
* **dead letter**: a permanent error reply, a window passed, or a script this process
  cannot run: written to the dead-letter file, then forgotten.

Scripts come back from the journal as a name and a SHA. The command is sent as
``EVALSHA``; a server that answers NOSCRIPT gets the source from ``scripts`` (the
registry) only when the registry's script of that name has the same SHA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ._deadletter import DeadLetter
from ._errors import BackendUnavailable, CommandError
from ._flush import send_round

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._backend import Backend
    from ._command import Command
    from ._journal import Journal, JournalEntry
    from ._scripts import Script

#: Longest safety margin kept between a replay and its window's end.
MAX_MARGIN_MS = 60_000


@attrs.define
class ReplayPass:
    """What one pass did."""

    applied: int = 0
    entries_done: int = 0
    dead: list[DeadLetter] = attrs.Factory(list)
    stopped: bool = False
    #: Entries dealt with, wholly or partly (to forget), and what remains of them.
    done: list[JournalEntry] = attrs.Factory(list)
    remainders: list[JournalEntry] = attrs.Factory(list)


def expired(entry: JournalEntry, i: int, now_ms: int) -> bool:
    """Whether ``entry.commands[i]`` is too old to replay safely.

    The margin (a tenth of the window, at most a minute) covers the time between the
    original send (when a marker may have been set) and the journal write.
    """
    window = entry.window_ms(i)
    if window is None or not entry.written_ms:
        return False
    return now_ms > entry.written_ms + window - min(MAX_MARGIN_MS, window // 10)


def resolve(command: Command, scripts: Mapping[str, Script]) -> Command:
    """``command`` with its source-less script replaced by the registry's, if the SHA matches."""
    script = command.script
    if script is None or script.source:
        return command
    known = scripts.get(script.name)
    if known is None or known.sha != script.sha:
        return command
    return attrs.evolve(command, script=known)


async def replay_pass(
    journal: Journal,
    backends: Mapping[str, Backend],
    scripts: Mapping[str, Script],
    *,
    now_ms: int,
    chunk_commands: int,
    max_chunks: int,
) -> ReplayPass:
    """Replay up to ``max_chunks`` chunks of ``journal``. A checkpoint.

    The caller writes the dead letters, then forgets ``done`` (keeping ``remainders``).
    """
    result = ReplayPass()
    entries = [e for e in journal.pending if e.backend in backends]
    start = 0
    chunks = 0
    while start < len(entries) and chunks < max_chunks and not result.stopped:
        chunk: list[JournalEntry] = []
        size = 0
        while start < len(entries) and (not chunk or size < chunk_commands):
            chunk.append(entries[start])
            size += len(entries[start].commands)
            start += 1
        chunks += 1
        await _replay_chunk(chunk, backends, scripts, now_ms, result)
    return result


async def _replay_chunk(
    chunk: list[JournalEntry],
    backends: Mapping[str, Backend],
    scripts: Mapping[str, Script],
    now_ms: int,
    result: ReplayPass,
) -> None:
    to_send: list[Command] = []
    where: list[tuple[int, int]] = []  # (entry index in chunk, command index in entry)
    verdicts: list[list[str]] = []
    for n, entry in enumerate(chunk):
        verdict = []
        for i, command in enumerate(entry.commands):
            if expired(entry, i, now_ms):
                verdict.append("dead")
                result.dead.append(_letter(entry, command, now_ms, "older than its replay "
                                           f"window ({entry.window_ms(i)} ms)"))
                continue
            verdict.append("keep")
            to_send.append(resolve(command, scripts))
            where.append((n, i))
        verdicts.append(verdict)

    def deliver(j: int, reply: object) -> None:
        n, i = where[j]
        entry = chunk[n]
        if isinstance(reply, BackendUnavailable):
            result.stopped = True
        elif isinstance(reply, CommandError):
            if reply.is_transient:
                return
            reason = reply.reply
            if reply.is_noscript:
                reason = (f"script {to_send[j].label!r} unknown to the server and not in this "
                          "process's registry with the same SHA (it changed since)")
            verdicts[n][i] = "dead"
            result.dead.append(_letter(entry, to_send[j], now_ms, reason))
        else:
            verdicts[n][i] = "applied"
            result.applied += 1

    if to_send:
        await send_round(to_send, backends, deliver)
    for n, entry in enumerate(chunk):
        keep = [i for i, v in enumerate(verdicts[n]) if v == "keep"]
        if len(keep) == len(entry.commands):
            continue
        result.done.append(entry)
        if keep:
            result.remainders.append(entry.subset(keep))
        else:
            result.entries_done += 1


def _letter(entry: JournalEntry, command: Command, now_ms: int, reason: str) -> DeadLetter:
    return DeadLetter(at_ms=now_ms, trace_id=entry.trace_id, command=command, reason=reason,
                      written_ms=entry.written_ms or None)
