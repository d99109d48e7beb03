"""The flush rule as pure, sync state: no Trio, no I/O, testable on its own.

A batch scope flushes "the moment every live participant is waiting on a handle (or a
dependency) or has finished". :class:`Barrier` counts live and blocked participants and
answers, after each event, whether the declared commands may leave now. Because a
participant is counted live from the moment it is *started* (not from its first
schedule), a participant that has not run yet holds the flush back, and so does one
doing other work (a SQL read, a computation). That is what makes the number of flushes
equal the depth of the dependency chain, whatever order Trio runs the tasks in.
"""

from __future__ import annotations

from typing import final

import attrs


@final
@attrs.define
class Barrier:
    """Counts of participants that are alive and that are blocked on the batch."""

    live: int = 0
    blocked: int = 0

    def started(self) -> None:
        """A participant was started (it counts as live, not blocked)."""
        self.live += 1

    def finished(self) -> None:
        """A live, unblocked participant returned or raised."""
        assert self.live > self.blocked, "a blocked participant cannot finish"
        self.live -= 1

    def block(self) -> None:
        """A live participant began waiting on a handle or on another participant."""
        assert self.blocked < self.live
        self.blocked += 1

    def unblock(self) -> None:
        """A blocked participant was woken (counted at wake-up, not when it runs)."""
        assert self.blocked > 0
        self.blocked -= 1

    def ready(self, *, pending: bool, flushing: bool) -> bool:
        """Whether a round may leave: something declared, nothing in flight, nobody busy."""
        return pending and not flushing and self.blocked == self.live

    def deadlocked(self, *, pending: bool, flushing: bool) -> bool:
        """Every live participant waits and no flush can wake any of them.

        A handle's waiter is woken by the flush that carries its command, which is either
        pending or in flight; so with neither, every blocked participant waits on another
        participant: a cycle.
        """
        return self.live > 0 and self.blocked == self.live and not pending and not flushing
