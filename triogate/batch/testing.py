"""Fakes for testing code that uses :mod:`triogate.batch` (as ``trio.testing`` is for Trio).

* :class:`RecordingBackend` records every pipeline and answers from a table or a function:
  round-trip assertions need no Redis. It has no ``script_fuser``: it sees one
  ``EVALSHA`` per script call, as declared.
* :class:`FaultyBackend` wraps any backend and delays, fails or drops pipelines on demand:
  the seam for chaos tests.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, final

import trio

from ._errors import BackendUnavailable, CommandError
from ._fusion import Fuser

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._backend import Backend, Wire


def _text(arg: object) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


@final
class RecordingBackend:
    """Records pipelines; answers each command from ``replies`` or ``respond``.

    Args:
        replies: command name (``"GET"``, or ``"EVALSHA"``) → reply. Missing → None.
        respond: called with each wire command; overrides ``replies`` when given. May
            return an exception instance to make that command fail.
        name: the backend's name.
        delay_s: each pipeline sleeps this long (on Trio's clock) before replying.
        scripts_loaded: if False, the first EVALSHA of each script answers NOSCRIPT until
            an EVAL of it is seen, as a freshly started server would.

    Attributes:
        pipelines: every pipeline received, in order, as lists of wire commands.
    """

    def __init__(
        self,
        replies: Mapping[str, object] | None = None,
        *,
        respond: Callable[[Wire], object] | None = None,
        name: str = "recording",
        delay_s: float = 0.0,
        scripts_loaded: bool = True,
    ) -> None:
        self._replies = dict(replies or {})
        self._respond = respond
        self._name = name
        self.delay_s = delay_s
        self._scripts_loaded = scripts_loaded
        self._known: set[str] = set()
        self.pipelines: list[list[Wire]] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def commands(self) -> list[str]:
        """Names of every command received, flattened, in order."""
        return [_text(c[0]).upper() for p in self.pipelines for c in p]

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        self.pipelines.append(list(commands))
        if self.delay_s:
            await trio.sleep(self.delay_s)
        else:
            await trio.lowlevel.checkpoint()
        return [self._answer(c) for c in commands]

    def _answer(self, wire: Wire) -> object:
        name = _text(wire[0]).upper()
        if name == "EVAL":
            source = wire[1] if isinstance(wire[1], bytes) else str(wire[1]).encode()
            self._known.add(hashlib.sha1(source).hexdigest())
        elif name == "EVALSHA" and not self._scripts_loaded and _text(wire[1]) not in self._known:
            return CommandError("NOSCRIPT No matching script. Please use EVAL.")
        if self._respond is not None:
            return self._respond(wire)
        return self._replies.get(name)


@final
class FaultyBackend:
    """Wraps a backend; makes it slow, down, or fail after a number of commands.

    Attributes:
        delay_s: added before each pipeline (Trio's clock).
        down: while True, every pipeline fails as a whole with BackendUnavailable.
        fail_after_commands: when set, the pipeline that would take the total of commands
            past it fails as a whole (once), as a connection reset mid-flight would.
    """

    def __init__(self, inner: Backend, *, delay_s: float = 0.0) -> None:
        self._inner = inner
        self.delay_s = delay_s
        self.down = False
        self.fail_after_commands: int | None = None
        self._seen = 0

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def script_fuser(self) -> Fuser | None:
        """The wrapped backend's (a wrapper is transparent to fusion)."""
        fuser = getattr(self._inner, "script_fuser", None)
        return fuser if isinstance(fuser, Fuser) else None

    async def execute(self, commands: Sequence[Wire]) -> list[object]:
        if self.delay_s:
            await trio.sleep(self.delay_s)
        if self.down:
            await trio.lowlevel.checkpoint()
            raise BackendUnavailable(self.name, "injected: down")
        self._seen += len(commands)
        if self.fail_after_commands is not None and self._seen > self.fail_after_commands:
            self.fail_after_commands = None
            await trio.lowlevel.checkpoint()
            raise BackendUnavailable(self.name, "injected: reset mid-flight")
        return await self._inner.execute(commands)
