"""Errors raised by :mod:`triogate.batch`.

The tree::

    BatchError                  anything the batch library raises on purpose
    ├── BackendUnavailable      the whole pipeline to a backend failed (refused, reset,
    │                           timed out, cancelled mid-flight): every owner in it sees one
    ├── CommandError            this owner's own reply was an error reply (carries .reply)
    └── BatchClosed             declared on a batch that has already closed

Gateway code catches these; it never subclasses them.
"""

from __future__ import annotations

#: Error replies that say "not now" rather than "never": the command was not applied and
#: the same command may succeed later (a server loading its data, a replica not yet
#: promoted, memory full, a script busy, a cluster reconfiguring).
TRANSIENT_REPLIES = frozenset(
    {"LOADING", "READONLY", "OOM", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN",
     "NOREPLICAS"}
)


class BatchError(Exception):
    """Base class of every error :mod:`triogate.batch` raises on purpose."""


class BackendUnavailable(BatchError):
    """Raised by awaiting a handle when the pipeline carrying it failed as a whole.

    The backend was refused, reset mid-flight, timed out, or the flush was cancelled.
    Every owner whose command rode that pipeline sees its own instance, so each can apply
    its own fail-open or fail-closed policy.
    """

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"backend {backend!r} unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class CommandError(BatchError):
    """Raised by awaiting a handle whose own reply was an error reply.

    Other commands in the same pipeline are unaffected. ``reply`` is the server's message,
    for instance ``"NOSCRIPT No matching script."``.
    """

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.reply = reply

    @property
    def is_noscript(self) -> bool:
        """Whether the server did not know the script's SHA (``EVALSHA`` → NOSCRIPT)."""
        return self.reply.startswith("NOSCRIPT")

    @property
    def is_transient(self) -> bool:
        """Whether the reply's class says the command was refused for now, not for good.

        ``LOADING``, ``READONLY``, ``OOM``, ``BUSY``, ``TRYAGAIN``, ``CLUSTERDOWN``,
        ``MASTERDOWN`` and ``NOREPLICAS`` (the first word of the reply, exactly: ``BUSYKEY``
        is permanent). A write refused so may be retried unchanged.
        """
        return self.reply.split(" ", 1)[0] in TRANSIENT_REPLIES


class BatchClosed(BatchError, RuntimeError):
    """Raised by ``call`` when the batch it is called on has already closed."""
