"""A guard against blocking the Trio loop, in the spirit of anyio's blockbuster.

While installed, a synchronous sleep, fsync, or a read/write/connect/accept on a *blocking*
socket or file descriptor, made on a thread that is running a Trio loop, is recorded as a
:class:`Blocked` call; so is a file opened there by the gateway's own code (triogate/).
Worker threads (``trio.to_thread``) and code outside any Trio run (sync tests, session
fixtures) may block as they like; Trio's own sockets are non-blocking, so they pass.
``tests/conftest.py`` installs it for the whole session and fails every test during which
something blocked a loop, naming the call and where it came from;
``@pytest.mark.allow_blocking("why")`` exempts a test.

Calls are recorded rather than raised so that a ``try/except Exception`` in the code under
test cannot hide them. Names bound before installation (``from time import sleep``) are
not seen; the gateway and the tests use module attributes.
"""

from __future__ import annotations

import builtins
import io
import os
import socket
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from trio.lowlevel import in_trio_run

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]
#: Where installed code lives (the standard library, site-packages): not ours to blame.
_LIBRARIES = tuple(sorted({str(Path(sysconfig.get_path(p)).resolve()) + os.sep
                           for p in ("stdlib", "platstdlib", "purelib", "platlib")}))
_ME = str(Path(__file__).resolve())

#: Socket methods that wait on the network when the socket is blocking.
SOCKET_METHODS = ("accept", "connect", "recv", "recv_into", "recvfrom", "recvfrom_into",
                  "recvmsg", "send", "sendall", "sendto", "sendmsg")

#: Frames allowed to block the loop, as (a fragment of the file's path, the function or ""
#: for any): stdlib paths that are cheap and bounded by design, or the test tooling's own.
ALLOWED_CALLERS: tuple[tuple[str, str], ...] = (
    # Importing reads files (a lazy import, a module-level constant such as a Lua script);
    # as in blockbuster, imports are not the loop's business.
    ("<frozen importlib._bootstrap", ""),
    # Starting a process: Popen waits on a pipe until the child has exec'd (brief, bounded).
    # The gateway forks its embedded server from the loop's own thread on purpose (see
    # triogate/redis_server.py: Linux's parent-death signal follows the forking thread).
    (os.sep + "subprocess.py", "_execute_child"),
    # A failing test's traceback reads source lines.
    (os.sep + "linecache.py", "updatecache"),
    (os.sep + "traceback.py", ""),
    # Hypothesis writes its example database; pytest its own files.
    ("hypothesis" + os.sep, ""),
    ("_pytest" + os.sep, ""),
)


@attrs.frozen
class Blocked:
    """One blocking call made on a Trio loop's thread."""

    call: str
    where: str  # the innermost frame of project code that led to it: "file:line in fn"
    thread: str

    def __str__(self) -> str:
        return f"{self.call} from {self.where} (thread {self.thread})"


@attrs.define
class Guard:
    """Records blocking calls made on Trio loop threads while :meth:`installed`."""

    found: list[Blocked] = attrs.field(factory=list)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _restore: list[tuple[Any, str, Any]] = attrs.field(factory=list)

    def take(self) -> list[Blocked]:
        """What was recorded since the last call, and forget it."""
        with self._lock:
            found, self.found = self.found, []
        return found

    def _record(self, call: str, *, gateway_only: bool) -> None:
        where = _culprit()
        if where is None or (gateway_only and not where.startswith("triogate" + os.sep)):
            return
        with self._lock:
            self.found.append(Blocked(call, where, threading.current_thread().name))

    def _wrap(self, owner: Any, name: str,
              blocking: Callable[..., bool] = lambda *a, **k: True, *,
              gateway_only: bool = False) -> None:
        original = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        record = self._record

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if in_trio_run() and blocking(*args, **kwargs):
                record(label, gateway_only=gateway_only)
            return original(*args, **kwargs)

        guarded.__wrapped__ = original  # type: ignore[attr-defined]
        guarded.__name__ = getattr(original, "__name__", name)
        self._restore.append((owner, name, original))
        setattr(owner, name, guarded)

    def install(self) -> None:
        self._wrap(time, "sleep", lambda seconds=0, *a: seconds > 0)
        # Opening a file counts in the gateway's code only: the tests' own small reads of
        # logs, configs and /proc are not what this guards against.
        self._wrap(builtins, "open", gateway_only=True)
        self._wrap(io, "open", gateway_only=True)
        self._wrap(os, "fsync")
        self._wrap(os, "read", lambda fd, *a: _fd_blocks(fd))
        self._wrap(os, "write", lambda fd, *a: _fd_blocks(fd))
        for method in SOCKET_METHODS:
            self._wrap(socket.socket, method, _socket_blocks)

    def uninstall(self) -> None:
        while self._restore:
            owner, name, original = self._restore.pop()
            setattr(owner, name, original)


def _socket_blocks(sock: socket.socket, *args: Any, **kwargs: Any) -> bool:
    try:
        return sock.gettimeout() != 0.0
    except OSError:  # closed: the call itself will fail at once
        return False


def _fd_blocks(fd: int) -> bool:
    try:
        return os.get_blocking(fd)
    except OSError:
        return False


def _culprit() -> str | None:
    """Where the blocking call came from: the innermost frame of code that is not an
    installed library (the gateway, the tests; this module aside). None when an allowed
    caller is on the way, or when no such frame is on the stack (a library's own
    business, such as Trio's or pytest's)."""
    frame = sys._getframe(3)
    while frame is not None:
        filename = frame.f_code.co_filename
        if any(fragment in filename and function in ("", frame.f_code.co_name)
               for fragment, function in ALLOWED_CALLERS):
            return None
        if (filename != _ME and not filename.startswith(_LIBRARIES)
                and not filename.startswith("<")):
            path = Path(filename)
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            return f"{shown}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return None
