"""Sending one round: one pipeline per backend, the backends concurrently.

Shared by batch scopes (before the model call) and the settler (after). Commands are
grouped by backend *object*, so two backend names that alias one server share one
pipeline. Replies are delivered as soon as their pipeline returns; scripts the server
did not know (NOSCRIPT) are retried with ``EVAL`` afterwards, so only their owners wait
for the retry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

import attrs
import trio

from ._errors import BackendUnavailable, CommandError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._backend import Backend, Wire
    from ._command import Command

logger = logging.getLogger("triogate.batch")

@final
@attrs.frozen(kw_only=True)
class PipelineSent:
    """One pipeline of a round, as the flush saw it (the tracer's raw material)."""

    backend: str
    indices: tuple[int, ...]
    duration_s: float
    ok: bool
    retry: bool = False


async def send_round(
    commands: Sequence[Command],
    backends: Mapping[str, Backend],
    deliver: Callable[[int, object], None],
    *,
    sent: Callable[[PipelineSent], None] | None = None,
) -> None:
    """Send ``commands`` (one round) and hand every reply to ``deliver``.

    ``deliver(i, reply)`` receives the reply of ``commands[i]``, or an exception instance
    (:class:`CommandError`, :class:`BackendUnavailable`). It is called exactly once per
    command unless this function is cancelled; callers fail whatever was not delivered.
    A checkpoint.
    """
    groups: dict[int, tuple[Backend, list[int]]] = {}
    for i, command in enumerate(commands):
        backend = backends[command.backend]
        groups.setdefault(id(backend), (backend, []))[1].append(i)
    if len(groups) == 1:
        (backend, indices), = groups.values()
        await _send_pipeline(backend, commands, indices, deliver, sent)
        return
    async with trio.open_nursery() as nursery:
        for backend, indices in groups.values():
            nursery.start_soon(_send_pipeline, backend, commands, indices, deliver, sent)


async def _send_pipeline(
    backend: Backend,
    commands: Sequence[Command],
    indices: list[int],
    deliver: Callable[[int, object], None],
    sent: Callable[[PipelineSent], None] | None,
) -> None:
    replies = await _execute(backend, [commands[i].wire() for i in indices], indices, sent, False)
    retry: list[int] = []
    for i, reply in zip(indices, replies, strict=True):
        script = commands[i].script
        # A source-less script (replayed from a journal, not in the registry) cannot be
        # EVALed: its NOSCRIPT goes to its owner.
        if isinstance(reply, CommandError) and reply.is_noscript and script and script.source:
            retry.append(i)
        else:
            deliver(i, reply)
    if retry:
        wires = [commands[i].wire(use_eval=True) for i in retry]
        for i, reply in zip(retry, await _execute(backend, wires, retry, sent, True), strict=True):
            deliver(i, reply)


async def _execute(
    backend: Backend,
    wires: list[Wire],
    indices: list[int],
    sent: Callable[[PipelineSent], None] | None,
    retry: bool,
) -> list[object]:
    started = trio.current_time()
    ok = True
    try:
        replies = await backend.execute(wires)
        if len(replies) != len(wires):
            raise BackendUnavailable(backend.name, "reply count does not match the pipeline")
    except BackendUnavailable as exc:
        ok = False
        replies = [exc] * len(wires)
    except Exception as exc:
        # A bug or an unexpected client error must not crash the owner nursery: every
        # owner sees the backend as unavailable and applies its own policy.
        logger.exception("backend %s failed unexpectedly", backend.name)
        ok = False
        replies = [BackendUnavailable(backend.name, f"{type(exc).__name__}: {exc}")] * len(wires)
    if sent is not None:
        sent(
            PipelineSent(
                backend=backend.name,
                indices=tuple(indices),
                duration_s=trio.current_time() - started,
                ok=ok,
                retry=retry,
            )
        )
    return replies
