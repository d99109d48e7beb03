"""Sending one round: one pipeline per backend, the backends concurrently.

Shared by batch scopes (before the model call) and the settler (after). Commands are
grouped by backend *object*, so two backend names that alias one server share one
pipeline. Replies are delivered as soon as their pipeline returns; scripts the server
did not know (NOSCRIPT) are retried with ``EVAL`` afterwards, so only their owners wait
for the retry. A backend with a ``script_fuser`` (a :class:`~._fusion.Fuser`) gets the
script calls of its pipeline fused into one ``EVALSHA`` per group (``_fusion.py``); the
replies are split back, so every owner receives what its own call would have received.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

import attrs
import trio

from ._errors import BackendUnavailable, CommandError
from ._fusion import Fuser, Unit

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
    fuser = getattr(backend, "script_fuser", None)
    if not isinstance(fuser, Fuser):
        fuser = None
    units = [Unit((i,)) for i in indices] if fuser is None else fuser.plan(commands, indices)
    wires = [u.wire(commands) for u in units]
    replies = await _execute(backend, wires, indices, sent, False)
    retry: list[Unit] = []
    for unit, reply in zip(units, replies, strict=True):
        if not unit.members:  # a fused script's SCRIPT LOAD: its reply is nobody's
            assert fuser is not None
            fuser.loaded(unit, reply)
        # A source-less script (replayed from a journal, not in the registry) cannot be
        # EVALed: its NOSCRIPT goes to its owner. Source-less scripts are never fused.
        elif isinstance(reply, CommandError) and reply.is_noscript and unit.evalable(commands):
            retry += [unit] if fuser is None else fuser.for_retry(unit)
        else:
            _deliver(unit, commands, reply, deliver)
    if retry:
        wires = [u.wire(commands, use_eval=True) for u in retry]
        again = [i for u in retry for i in u.members]
        replies = await _execute(backend, wires, again, sent, True)
        for unit, reply in zip(retry, replies, strict=True):
            _deliver(unit, commands, reply, deliver)


def _deliver(
    unit: Unit, commands: Sequence[Command], reply: object, deliver: Callable[[int, object], None]
) -> None:
    if unit.fused is None:
        deliver(unit.members[0], reply)
        return
    for i, own in zip(unit.members, unit.split(commands, reply), strict=True):
        deliver(i, own)


async def _execute(
    backend: Backend,
    wires: list[Wire],
    indices: list[int],
    sent: Callable[[PipelineSent], None] | None,
    retry: bool,
) -> list[object]:
    started = trio.current_time() if sent is not None else 0.0  # only records use it
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
