"""The process's open-files limit, and how many client connections fit in it.

Every client connection is a descriptor, and a gateway holds a second one for it while
the upstream call runs (a stream: for minutes). Linux starts processes with a soft limit
of 1,024 descriptors under most shells and service managers, with a hard limit far
higher (systemd: 524,288): left there, a worker serving 500 streams would fail to open
upstream connections, Redis connections or SQLite files, and the errors would land on
requests already admitted. So the gateway raises its soft limit to the hard one at start
(as the Go runtime does for every program, and nginx with ``worker_rlimit_nofile``), and
bounds its client connections to what is left after one upstream descriptor each and a
reserve for everything else (:func:`connections_for`).
"""

from __future__ import annotations

import resource

#: Descriptors kept for what is not a client or an upstream connection: the listening
#: socket, the Redis pool, the database pool and files, logs, the embedded server's pipes.
RESERVED_FILES = 256
#: No higher than this even when the hard limit is unlimited (the kernel's nr_open).
_CEILING = 1 << 20


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; ``(before, after)``.

    Never lowers it; a refusal (a container that forbids it) leaves it as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, want
    return soft, soft


def open_files_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` (an unlimited one counts as ``_CEILING``)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _CEILING if soft == resource.RLIM_INFINITY else soft


def connections_for(open_files: int) -> int:
    """Client connections that fit in ``open_files`` descriptors: one upstream descriptor
    each besides their own, after :data:`RESERVED_FILES` (at least 32)."""
    return max(32, (open_files - RESERVED_FILES) // 2)
