"""One declared command: what it is, whose it is, where it goes."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

if TYPE_CHECKING:
    from ._scripts import Script

#: What the wire accepts as an argument; ints and floats are sent in decimal.
Arg = bytes | str | int | float


@final
@attrs.frozen(slots=True)
class Command:
    """A command or script call declared by ``owner`` for ``backend``.

    ``keys`` are kept apart from ``args`` so that a cluster backend can route by them and a
    journal can replay them; for a plain command the wire form is ``name *keys *args``.
    """

    name: str
    keys: tuple[Arg, ...]
    args: tuple[Arg, ...]
    owner: str
    backend: str
    script: Script | None = None

    def wire(self, *, use_eval: bool = False) -> tuple[Arg, ...]:
        """The command as sent: ``EVALSHA``/``EVAL`` for scripts, else ``name *keys *args``."""
        if self.script is None:
            return (self.name, *self.keys, *self.args)
        if use_eval:
            return ("EVAL", self.script.source, len(self.keys), *self.keys, *self.args)
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)

    @property
    def label(self) -> str:
        """A short name for traces: the command name, or ``EVALSHA <script name>``."""
        return self.name if self.script is None else f"EVALSHA {self.script.name}"
